"""Type stub of the C extension ``_fastread.c``: the plain case of ``FileAccess.read``."""

def read_beneath(
    root: bytes, names: tuple[bytes, ...], uid: int, gid: int, as_owner: bool, limit: int, /
) -> bytes | None: ...
