import sys

sys.path.insert(0, ".")
from wordcount import count_words

assert count_words("a  b\nc\td") == 4, count_words("a  b\nc\td")
assert count_words("") == 0
assert count_words(" one ") == 1
print("ok")
