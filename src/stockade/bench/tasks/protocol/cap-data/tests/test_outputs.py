with open("totals.csv", encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
assert lines == ["region,total", "east,100.00", "north,15.00", "south,5.00"], lines
print("ok")
