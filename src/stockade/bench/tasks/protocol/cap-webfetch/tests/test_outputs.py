with open("version.txt", encoding="utf-8") as f:
    version = f.read().strip()
assert version == "v42", version
print("ok")
