"""The built-in reward sources and the credit methods built on them, one module each.

- ``token_only``: no segments (``uniform``: GRPO's σ = 1/|o|; ``entropy``: token-entropy weighting);
- ``exit_values``: RREDCoT's teacher-forced exit-point values (``rredcot``, ``rredcot+entropy``);
- ``oracle``: perfect blame where the task says a trace goes wrong (``oracle``);
- ``monte_carlo``: values from policy rollouts at the same exit points (``mc``);
- ``exact``: values the synthetic task computes at the same exit points (``exact``), registered as any
  added method is;
- ``spo``: SPO-chain's segment advantages from rollouts at boundaries where the policy is unsure
  (``spo``, arXiv 2505.23564), a method of the ``advantage`` form;
- ``implicit_prm``: PRIME's token advantages from an implicit process reward model the caller trains
  online (``prime``, arXiv 2502.01456), a method of the ``advantage`` form.

Importing this package registers them (``rredcot.method.registry``) in the order of the imports
below, which is the order the config lists the methods in. A new credit method is one more module
here and one more import (docs/library.md, "Adding a credit method").
"""

# The order of registration, not the alphabet:
# isort: off
from rredcot.method.sources import token_only  # noqa: F401
from rredcot.method.sources import exit_values  # noqa: F401
from rredcot.method.sources import oracle  # noqa: F401
from rredcot.method.sources import monte_carlo  # noqa: F401
from rredcot.method.sources import exact  # noqa: F401
from rredcot.method.sources import spo  # noqa: F401
from rredcot.method.sources import prime  # noqa: F401
# isort: on
