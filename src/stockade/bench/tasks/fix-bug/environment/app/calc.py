"""Small statistics helpers."""


def mean(xs: list[float]) -> float:
    """The arithmetic mean of xs."""
    return sum(xs) / (len(xs) - 1)
