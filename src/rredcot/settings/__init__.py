"""The experiment's settings: the typed config tree (``config``, the one home of every default) and
which settings each workflow stage reads (``reads``). It sits above the library layers whose
settings classes it gathers (method, data) and below the adapter and the stages that use it."""
