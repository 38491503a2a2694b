"""The built-in reward sources and the credit methods built on them, one module each.

- ``token_only``: no segments (``uniform``: GRPO's σ = 1/|o|; ``entropy``: token-entropy weighting);
- ``exit_values``: RREDCoT's teacher-forced exit-point values (``rredcot``, ``rredcot+entropy``);
- ``oracle``: perfect blame where the task says a trace goes wrong (``oracle``);
- ``monte_carlo``: values from policy rollouts at the same exit points (``mc``);
- ``exact``: values the synthetic task computes at the same exit points (``exact``), registered as any
  added method is.

Importing this package registers them (``rredcot.method.registry``), in this order (the order the
config lists the methods in), then every other module of the package: a new credit method is one
more module here (docs/library.md, "Adding a credit method").
"""

import importlib
import pkgutil

BUILT_IN = ("token_only", "exit_values", "oracle", "monte_carlo")

for _name in (*BUILT_IN, *sorted({m.name for m in pkgutil.iter_modules(__path__)} - set(BUILT_IN))):
    importlib.import_module(f"{__name__}.{_name}")
