#!/usr/bin/python3
# Reference vectors for test_kv_hash.c, computed the way vLLM does (v1
# kv_cache_utils: hash_fn = sha256_cbor / xxhash_cbor, NONE_HASH =
# hash_fn(PYTHONHASHSEED), block = hash_fn((parent, tuple(tokens), extra))).
# Run once with Debian's python3-cbor2 and python3-xxhash; the output was
# pasted into test_kv_hash.c. Not run by ctest (no Python dependency).
import hashlib

import cbor2
import xxhash


def enc(obj):
    return cbor2.dumps(obj, canonical=True)


ALGOS = {
    "xxhash_cbor": lambda o: xxhash.xxh3_128_digest(enc(o)),
    "sha256_cbor": lambda o: hashlib.sha256(enc(o)).digest(),
}

BIG = [23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
       2**64 - 1, 0, 1, 2**64 - 2]


def chain(fn, seed, bs, tokens, lora=None, salt=None):
    none = fn(seed)
    out, parent = [], none
    for start in range(0, len(tokens) - bs + 1, bs):
        keys = ([lora] if lora is not None else []) + \
               ([salt] if salt and start == 0 else [])
        parent = fn((parent, tuple(tokens[start:start + bs]),
                     tuple(keys) if keys else None))
        out.append(parent)
    tail = tokens[len(tokens) // bs * bs:]
    t = None
    if len(tail) > 1 and lora is None and not salt:
        t = fn((parent, tuple(tail), None))
    return none, out, t


CASES = [
    ("seed0", "0", 4, list(range(1, 11)), None, None),
    ("seed42", "42", 4, [], None, None),
    ("seed_empty", "", 4, [], None, None),
    ("lora", "0", 4, list(range(1, 11)), "my-lora", None),
    ("salt", "0", 4, list(range(1, 11)), None, "s1"),
    ("lora_salt", "0", 4, list(range(1, 11)), "my-lora", "s1"),
    ("big", "0", 4, BIG, None, None),
    ("tail_only", "0", 4, [7, 8], None, None),
]

for name, fn in ALGOS.items():
    print(f"== {name}")
    for case, seed, bs, toks, lora, salt in CASES:
        none, blocks, tail = chain(fn, seed, bs, toks, lora, salt)
        print(f"{case} none {none.hex()}")
        for i, b in enumerate(blocks):
            print(f"{case} block {i} {b.hex()}")
        if tail is not None:
            print(f"{case} tail {tail.hex()}")
