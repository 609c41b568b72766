import sys

sys.path.insert(0, ".")
from primes import is_prime

assert [n for n in range(30) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
assert not is_prime(-7) and not is_prime(1) and is_prime(7919)
print("ok")
