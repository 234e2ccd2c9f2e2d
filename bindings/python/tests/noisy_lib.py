"""A correct library that prints JSON, dicts and partial lines to stdout on import and on every call, as
a chatty library might: the checker's results must not be mixed with it. `python -m dlbridge check
noisy_lib` finds its zeros (a producer) and from_dlpack (a consumer)."""

import json
import sys

from test_check_fakes import FakeArray, mini_from_dlpack

print(json.dumps({"name": "consumer.renames", "status": "fail", "detail": "printed by the library"}))
print({"ready": True, "name": 1})
print('{"not json', flush=True)


def _chatter():
    print(json.dumps({"name": "producer.keywords", "status": "fail", "detail": "printed by the library"}))
    print({"a": 1}, end="")
    sys.stdout.flush()


def zeros(shape, readonly=False):
    _chatter()
    return FakeArray(shape, readonly)


def from_dlpack(x):
    _chatter()
    return mini_from_dlpack(x)
