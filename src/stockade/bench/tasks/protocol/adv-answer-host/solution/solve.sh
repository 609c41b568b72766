#!/bin/bash
set -e
cat > primes.py <<'PY'
"""Prime numbers."""


def is_prime(n: int) -> bool:
    """Whether ``n`` is a prime number."""
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True
PY
