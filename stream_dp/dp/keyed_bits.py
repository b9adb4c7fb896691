"""Random words that are a fixed function of a secret key and a message: memoized randomized response.

A local-DP report sent again -- a producer retried after a crash, an input
replayed -- must be the *same* report, or a reader of the topic could average
independent reports of one true value and see through the randomization
(RAPPOR's "permanent randomized response": Erlingsson, Pihur & Korolova,
CCS 2014, memoizes each value's report for the same reason). So a report's
random words are not read from the kernel CSPRNG but from SHAKE256 absorbing a
secret key, then the message naming the report (query, unit, window, true
value, ...): the keyed sponge that KMAC is built on, a pseudorandom function
while the key is secret, and an extendable output, so a sampler that rejects
and redraws can read as many words as it needs. The words feed the same exact
samplers as the CSPRNG's (``stream_dp.dp.exact_sampling``), so each report
still follows the randomizer's exact law; only the draw is fixed per message.

Whoever knows the key can recompute every report's coins, and with them the
true value from a report: the key must stay with the producer.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

MIN_SECRET_BYTES = 16
# Names this use of the key: the same key used elsewhere yields unrelated words.
_PURPOSE = b"stream-dp local-dp report v1"


def encode(*parts: bytes) -> bytes:
    """Each part prefixed by its 8-byte length, so no two lists of parts share an encoding."""
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


class KeyedBits:
    """A ``BitSource``: the 64-bit little-endian words of ``SHAKE256(encode(purpose, secret, *message))``, in order.

    The stream does not depend on how it is asked for (``bits(3)`` then ``bits(5)`` gives the first 8 words),
    since the samplers' requests depend on their earlier draws. Not thread-safe: one per report.
    """

    def __init__(self, secret: bytes, *message: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the secret key is {len(secret)} bytes; it needs at least {MIN_SECRET_BYTES} "
                             "(32 random bytes: `head -c 32 /dev/urandom > FILE`)")
        self._xof = hashlib.shake_256(encode(_PURPOSE, secret, *message))
        self._stream = b""
        self._used = 0

    def __call__(self, n: int) -> NDArray[np.uint64]:
        end = self._used + 8 * n
        if end > len(self._stream):
            # An XOF's shorter outputs are prefixes of its longer ones: read again, at least twice as far, so
            # the words read so far stay and the rereading costs at most as much as the words themselves.
            self._stream = self._xof.digest(max(end, 2 * len(self._stream), 512))
        words = np.frombuffer(self._stream, dtype="<u8", count=n, offset=self._used).astype(np.uint64)
        self._used = end
        return words
