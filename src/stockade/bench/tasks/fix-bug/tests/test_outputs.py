import sys

sys.path.insert(0, ".")
import calc

assert calc.mean([1, 2, 3]) == 2, calc.mean([1, 2, 3])
assert calc.mean([4]) == 4
assert abs(calc.mean([0.5, 1.5]) - 1.0) < 1e-9
print("ok")
