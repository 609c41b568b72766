"""Prime numbers."""


def is_prime(n: int) -> bool:
    """Whether ``n`` is a prime number."""
    raise NotImplementedError
