"""k-space reconstruction tools: ``recon.zero_filled``, ``recon.grappa``, ``recon.sense`` and
their ``_cine`` variants. Every tool maps a multi-coil ``KSpace`` (C, X, Y, Z[, T]) to a
magnitude ``Image`` (X, Y, Z) or ``Cine`` (X, Y, Z, T) on the k-space's own affine.

The core routines are written against an array module ``xp`` (numpy, or cupy for
``device="cuda"``) so the CPU and GPU paths are the same code.
"""
