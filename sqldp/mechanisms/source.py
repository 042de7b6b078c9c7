"""Where the noise comes from: the OS CSPRNG, or (test mode only) a seeded PRNG. Every sampler of
sqldp.mechanisms draws its bits from a :class:`NoiseSource`."""

from __future__ import annotations

import random
import secrets


class NoiseSource:
    """Uniform variates on (0, 1) from the OS CSPRNG, or (test mode only) from a seeded PRNG."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self.test_mode = rng is not None

    @classmethod
    def seeded(cls, seed: int) -> NoiseSource:
        """TEST MODE: reproducible noise. Every result built with it carries ``test_mode = True``."""
        return cls(random.Random(seed))

    def bits(self, n: int) -> int:
        """n uniform random bits, as an integer in [0, 2^n)."""
        return self._rng.getrandbits(n)

    def uniform(self) -> float:
        """A uniform variate in the open interval (0, 1)."""
        while True:
            u = self._rng.random()
            if u > 0.0:
                return u

    def sign(self) -> float:
        return 1.0 if self._rng.random() < 0.5 else -1.0

    def index(self, n: int) -> int:
        """A uniform integer in [0, n), exactly (``randrange`` rejects the bits past n)."""
        return self._rng.randrange(n)
