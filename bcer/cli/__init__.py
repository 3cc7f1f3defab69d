"""The ``bcer`` command: ``main`` (the commands), ``options`` (the shared option group and the
option types), ``views`` (what it prints), ``data`` (``bcer data inspect``), ``memory``
(``bcer memory``). The console script is ``bcer.cli.main:app``."""
