"""``python -m bcer.cli``: the same command as the ``bcer`` console script."""
from .main import main

main()
