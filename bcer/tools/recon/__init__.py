"""k-space reconstruction tools: ``recon.zero_filled``, ``recon.grappa``, ``recon.sense`` and
their ``_cine`` variants. Every tool maps a multi-coil ``KSpace`` (C, X, Y, Z[, T]) to a
magnitude ``Image`` (X, Y, Z) or ``Cine`` (X, Y, Z, T) on the header's recon matrix: the
reconstruction runs on the full encoded matrix, and the coil-combined image is then
centre-cropped to ``meta["recon_matrix"]`` (readout oversampling removed) exactly as fastMRI
makes ``reconstruction_rss``, on ``KSpace.recon_affine`` (``KSpace.affine`` when the k-space
carries no recon matrix).

The core routines are written against an array module ``xp`` (numpy, or cupy for
``device="cuda"``) so the CPU and GPU paths are the same code.
"""
