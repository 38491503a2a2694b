"""The method in pure torch: σ (``credit``), segmentation, the model calls of the credit passes
(``forward``), exit-point scoring (``scoring``), the answer baseline, the registries of reward
sources and credit methods (``registry``, the built-ins in ``sources``), the settings
(``settings``) and the credit pipeline (``assign``).

Importing the package registers the built-in reward sources and credit methods, so that the
registry is complete whichever module is imported first.
"""

from rredcot.method import sources  # noqa: F401
