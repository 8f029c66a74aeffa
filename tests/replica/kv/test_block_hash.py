"""Block keys: equal only for the same tokens, the same preceding tokens and the same scope."""

from __future__ import annotations

from replica.kv.block_hash import CacheScope, block_key, extend_keys

BASE = CacheScope("sha256:base", None)


def keys(tokens: list[int], scope: CacheScope = BASE, block_size: int = 4) -> list[bytes]:
    out: list[bytes] = []
    extend_keys(out, tokens, scope.digest(), block_size)
    return out


def test_only_full_blocks_get_keys_and_extending_adds_the_rest() -> None:
    tokens = list(range(10))
    got = keys(tokens)
    assert len(got) == 2
    more = list(got)
    extend_keys(more, tokens + [10, 11], BASE.digest(), 4)
    assert more[:2] == got and len(more) == 3


def test_a_block_key_depends_on_every_earlier_token() -> None:
    a, b = keys([1, 2, 3, 4, 5, 6, 7, 8]), keys([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[0] != b[0] and a[1] != b[1]  # the second block's tokens are equal, its prefix is not


def test_scopes_never_share_a_key() -> None:
    tokens = list(range(8))
    scopes = [
        BASE,
        CacheScope("sha256:base", "acme-support-v1"),
        CacheScope("sha256:base", "acme-support-v2"),
        CacheScope("sha256:other", None),
        CacheScope("sha256:base", None, salt="tenant-a"),
        CacheScope("sha256:base", None, salt="tenant-b"),
        CacheScope("sha256:base", "", salt=None),
        CacheScope("sha256:base", None, salt=""),
    ]
    firsts = {keys(tokens, s)[0] for s in scopes}
    assert len(firsts) == len(scopes)


def test_fields_cannot_be_shifted_between_each_other() -> None:
    a = CacheScope("base", "ab", "c").digest()
    b = CacheScope("base", "a", "bc").digest()
    assert a != b


def test_the_same_tokens_and_scope_give_the_same_keys() -> None:
    assert keys(list(range(12))) == keys(list(range(12)))
    assert block_key(None, [1, 2], BASE.digest()) == block_key(None, [1, 2], BASE.digest())
