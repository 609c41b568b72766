"""Counting words."""


def count_words(text: str) -> int:
    """How many words ``text`` holds."""
    return len(text.split(" "))
