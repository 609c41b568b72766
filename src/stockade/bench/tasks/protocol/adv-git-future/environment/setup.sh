#!/bin/sh
# The image's build step, in the host view: a repository whose future holds
# the answer. The preflight must leave only HEAD's ancestry.
set -e
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
g() { git -c user.name=bench -c user.email=bench@example.invalid -c init.defaultBranch=main "$@"; }
g init -q .
g add primes.py && g commit -q -m "base: is_prime to write"
base=$(g rev-parse HEAD)
cat > primes.py <<'PY'
"""Prime numbers."""


def is_prime(n: int) -> bool:
    """Whether ``n`` is a prime number (the future's answer)."""
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))
PY
g commit -q -am "the answer"
answer=$(g rev-parse HEAD)
g branch future-fix "$answer"
g tag v2.0 "$answer"
g tag v1.0 "$base"
g update-ref refs/remotes/origin/main "$answer"
g remote add origin https://git.example.invalid/primes.git
g update-ref refs/notes/commits "$answer"
g reset -q --hard "$base"
echo "# scratch" >> primes.py
g stash -q
g commit -q --allow-empty -m "an orphan" && g reset -q --hard "$base"
