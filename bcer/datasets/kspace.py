"""Multi-coil Cartesian k-space from phantom images: the forward model recon is measured against.

Conventions (the recon tools implement their inverse against exactly this):

- Array layout (``bcer.contracts.artifacts.KSpace``): ``data`` is complex64 of shape
  (C, X, Y, Z) for an Image or (C, X, Y, Z, T) for a Cine; coils first. The 2-D Fourier
  transform runs over the in-plane axes X and Y only (``data`` axes 1 and 2); Z (slices) and
  T (frames) are independent (multi-slice 2-D acquisition). The readout is X (always fully
  sampled); phase encoding is Y. ``mask`` is a boolean (Y,) vector: line ``y`` was acquired
  iff ``mask[y]``; unacquired lines are exactly 0 in ``data``.
- Forward transform, per coil/slice/frame, with ``axes = (1, 2)`` of ``data``
  (or ``(0, 1)`` of an (X, Y) image)::

      k = fftshift(fftn(ifftshift(x, axes), axes=axes, norm="ortho"), axes)

  Inverse (what zero-filled recon does before combining coils)::

      x = fftshift(ifftn(ifftshift(k, axes), axes=axes, norm="ortho"), axes)

  So the k-space centre (DC) sits at index ``(X // 2, Y // 2)``, and the transform is
  unitary: image-domain and k-space noise have the same standard deviation.
- Coil images are ``maps[c] * image`` with the (C, X, Y) sensitivity ``maps`` shared by every
  slice and frame. Maps are normalised so that ``sqrt(sum_c |maps[c]|**2) == 1`` at every
  pixel, hence root-sum-of-squares of the fully sampled coil images equals ``|image|``
  exactly (up to float32 rounding) when there is no noise.
- Auto-calibration (ACS) region: the ``n_acs`` contiguous lines
  ``Y // 2 - n_acs // 2 ... Y // 2 - n_acs // 2 + n_acs - 1`` (contains the centre line).
  Outer lines: ``pattern="regular"`` samples every R-th line on the lattice
  ``(y - Y // 2) % R == 0`` (GRAPPA-friendly, consistent with the ACS); ``"random"`` samples
  ``round(n_outer / R)`` outer lines drawn uniformly without replacement. Either way the
  outer region is undersampled by the nominal factor R; the effective acceleration
  (``Y / n_sampled``, ``KSpace.acceleration``) is lower because of the ACS.
- Noise: complex white Gaussian, std ``noise * max|image|`` per real/imag component, added to
  every acquired sample (independent across coils); recorded as ``meta["noise_sigma"]``.
"""
from __future__ import annotations

import copy
import inspect
import logging
from typing import Any, Literal

import numpy as np

from ..contracts.artifacts import Cine, Image, KSpace
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import same_grid
from .generators import GENERATORS, get_generator
from .phantom import Phantom, Size

log = logging.getLogger(__name__)

FFT_CONVENTION = "ifftshift>fftn(axes=X,Y, norm=ortho)>fftshift; centre at (X//2, Y//2)"
Pattern = Literal["regular", "random"]


def fft2c(x: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """Centred orthonormal 2-D FFT over ``axes`` (the bcer k-space convention)."""
    return np.fft.fftshift(np.fft.fftn(np.fft.ifftshift(x, axes=axes), axes=axes, norm="ortho"),
                           axes=axes)


def ifft2c(k: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """Inverse of :func:`fft2c`."""
    return np.fft.fftshift(np.fft.ifftn(np.fft.ifftshift(k, axes=axes), axes=axes, norm="ortho"),
                           axes=axes)


def rss(coil_images: np.ndarray, axis: int = 0) -> np.ndarray:
    """Root-sum-of-squares coil combination."""
    return np.sqrt(np.sum(np.abs(coil_images) ** 2, axis=axis))


def coil_maps(shape_xy: tuple[int, int], n_coils: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth complex coil sensitivities, (C, X, Y) complex64, with RSS == 1 at every pixel.

    Coils sit on an ellipse just outside the field of view (a ring array, random rotation);
    each magnitude falls off with distance like a surface coil and each carries a smooth
    linear phase plus a random constant phase, so the maps are realistic enough for
    GRAPPA/SENSE calibration yet smooth.

    Args:
        shape_xy: in-plane matrix (X, Y).
        n_coils: number of receive coils (>= 1).
        rng: numpy Generator (seeded by the caller).
    """
    if n_coils < 1:
        raise ToolError(ErrorCode.value_range, f"n_coils must be >= 1, got {n_coils}", arg="n_coils")
    nx, ny = (int(s) for s in shape_xy)
    # normalised coordinates in [-1, 1] so maps look alike at any matrix size
    gx, gy = np.meshgrid(np.linspace(-1, 1, nx), np.linspace(-1, 1, ny), indexing="ij")
    angles = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(n_coils) / n_coils
    radius = 1.3 * rng.uniform(0.95, 1.05, n_coils)
    maps = np.empty((n_coils, nx, ny), dtype=np.complex128)
    for c, (a, r) in enumerate(zip(angles, radius)):
        cx, cy = r * np.cos(a), r * np.sin(a)
        d2 = (gx - cx) ** 2 + (gy - cy) ** 2
        mag = 1.0 / (0.35 + d2)
        phase = rng.uniform(-np.pi, np.pi) + 0.8 * (np.cos(a) * gx + np.sin(a) * gy)
        maps[c] = mag * np.exp(1j * phase)
    maps /= rss(maps)[None]
    return maps.astype(np.complex64)


def acs_slice(ny: int, n_acs: int) -> slice:
    """The contiguous, centred auto-calibration lines (see module docstring)."""
    start = ny // 2 - n_acs // 2
    return slice(start, start + n_acs)


def undersample_mask(ny: int, R: int, n_acs: int = 24, rng: np.random.Generator | None = None,
                     pattern: Pattern = "regular") -> np.ndarray:
    """Boolean (Y,) phase-encoding mask: ``n_acs`` centre lines plus outer lines at rate 1/R.

    Raises:
        ToolError: ``value_range`` if R < 1, the ACS does not fit in ``ny``, or ``pattern``
            is unknown; ``random`` needs ``rng``.
    """
    if R < 1:
        raise ToolError(ErrorCode.value_range, f"acceleration R must be >= 1, got {R}", arg="R")
    if not 0 <= n_acs <= ny:
        raise ToolError(ErrorCode.value_range, f"n_acs={n_acs} does not fit in {ny} phase-encoding lines",
                        arg="n_acs")
    mask = np.zeros(ny, dtype=bool)
    mask[acs_slice(ny, n_acs)] = True
    outer = np.flatnonzero(~mask)
    if pattern == "regular":
        mask[outer[(outer - ny // 2) % R == 0]] = True
    elif pattern == "random":
        if rng is None:
            raise ToolError(ErrorCode.value_range, "pattern='random' needs an rng", arg="rng")
        n_pick = int(round(outer.size / R))
        mask[rng.choice(outer, size=n_pick, replace=False)] = True
    else:
        raise ToolError(ErrorCode.value_range, f"unknown sampling pattern {pattern!r}",
                        hint="valid: ['random', 'regular']", arg="pattern")
    return mask


def _forward(data: np.ndarray, maps: np.ndarray, mask: np.ndarray, sigma: float,
             rng: np.random.Generator) -> np.ndarray:
    """Coil k-space (C, X, Y, ...) of ``data`` (X, Y, ...), computed a few planes at a time so
    a full-size cine does not need several coil-sized complex temporaries at once."""
    nx, ny = data.shape[:2]
    planes = data.reshape(nx, ny, -1)
    n_coils = maps.shape[0]
    k = np.empty((n_coils, nx, ny, planes.shape[2]), dtype=np.complex64)
    chunk = max(1, (1 << 23) // (n_coils * nx * ny))  # ~64 MB of complex64 per step
    for start in range(0, planes.shape[2], chunk):
        sl = slice(start, start + chunk)
        block = fft2c(maps[..., None] * planes[None, :, :, sl].astype(np.complex64), axes=(1, 2))
        if sigma > 0:
            block += sigma * (rng.standard_normal(block.shape, dtype=np.float32)
                              + 1j * rng.standard_normal(block.shape, dtype=np.float32))
        block[:, :, ~mask] = 0
        k[..., sl] = block
    return k.reshape((n_coils,) + data.shape)


def make_kspace(image: Image | Cine, n_coils: int = 8, R: int = 4, n_acs: int = 24,
                noise: float = 0.0, rng: np.random.Generator | None = None,
                pattern: Pattern = "regular", maps: np.ndarray | None = None) -> tuple[KSpace, np.ndarray]:
    """Simulate an undersampled multi-coil acquisition of ``image`` (module docstring has the model).

    Args:
        image: a 3-D Image (X,Y,Z) or a Cine (X,Y,Z,T); magnitude is what is imaged.
        n_coils: receive coils.
        R: nominal acceleration of the outer k-space.
        n_acs: fully sampled centre lines.
        noise: complex noise std as a fraction of ``max|image|`` (0 = noiseless).
        rng: seeded Generator (maps, random mask, noise).
        pattern: ``regular`` or ``random`` outer lines.
        maps: optional (C,X,Y) sensitivities to reuse instead of drawing new ones.

    Returns:
        (KSpace with ``affine`` = image.affine, coil maps (C,X,Y) complex64).
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    data = np.asarray(image.data)
    if data.ndim not in (3, 4):
        raise ToolError(ErrorCode.shape, f"make_kspace needs (X,Y,Z) or (X,Y,Z,T), got {data.shape}",
                        arg="image")
    if not np.all(np.isfinite(data)):
        raise ToolError(ErrorCode.numeric, "image has NaN/Inf values", arg="image")
    if noise < 0:
        raise ToolError(ErrorCode.value_range, f"noise must be >= 0, got {noise}", arg="noise")
    nx, ny = data.shape[:2]
    if maps is None:
        maps = coil_maps((nx, ny), n_coils, rng)
    elif maps.shape != (maps.shape[0], nx, ny):
        raise ToolError(ErrorCode.shape, f"maps {maps.shape} do not match image plane {(nx, ny)}", arg="maps")
    mask = undersample_mask(ny, R, n_acs, rng, pattern)
    sigma = float(noise) * float(np.max(np.abs(data))) if noise > 0 else 0.0
    k = _forward(data, maps, mask, sigma, rng)
    meta: dict[str, Any] = {
        "R": int(R), "n_acs": int(n_acs), "pattern": pattern, "n_coils": int(maps.shape[0]),
        "noise_sigma": sigma, "fft": FFT_CONVENTION,
        "effective_acceleration": float(ny) / int(mask.sum()),
    }
    log.debug("k-space %s, R=%d (effective %.2f)", k.shape, R, meta["effective_acceleration"])
    return KSpace(k, mask, np.asarray(image.affine, dtype=np.float64).copy(), meta), maps


# domain -> (generator, source sequence, fastMRI acquisition code, ISMRMRD protocol name);
# the generator is the domain's entry of the one table, generators.GENERATORS
KSPACE_SOURCES: dict[str, tuple[str, str, str, str]] = {d: (GENERATORS[d], *rest) for d, rest in {
    "cardiac": ("CINE", "CINE_BSSFP", "cardiac cine bSSFP short axis"),
    "prostate": ("T2w", "AXT2", "prostate AX T2 FSE"),
    "brain": ("T2", "AXT2", "brain AX T2 FSE"),
}.items()}


def _source_phantom(case_id: str, seed: int, size: Size, domain: str, **kw: Any) -> tuple[Phantom, Any]:
    if domain not in KSPACE_SOURCES:
        raise ToolError(ErrorCode.value_range, f"no k-space source for domain {domain!r}",
                        hint=f"valid: {sorted(KSPACE_SOURCES)}", arg="domain")
    seq = KSPACE_SOURCES[domain][1]
    gen = get_generator(domain)  # lazily: a domain's module may be absent
    func = gen.__name__
    params = inspect.signature(gen).parameters
    if "noise" in kw and "noise" not in params:
        kw.pop("noise")
    if kw.get("family", "base") != "base" and "family" not in params:
        raise ToolError(ErrorCode.value_range, f"{func} has no phantom family {kw['family']!r}",
                        hint="only 'base' for this domain", arg="family", case=case_id)
    ph = gen(case_id, seed, size, **kw)
    return ph, ph.sequences[seq]


def oversample_in_plane(vol: Any, encoded: tuple[int, int]) -> Any:
    """Zero-pad an Image/Cine to the ``encoded`` in-plane matrix so that fastMRI's centre
    crop (``KSpace.recon_crop``: offsets ``(E - R) // 2``) gives back exactly ``vol``; the
    affine moves so every voxel keeps its world position. This is readout (X) and phase (Y)
    oversampling: a larger field of view at the same voxel size."""
    data = np.asarray(vol.data)
    nx, ny = data.shape[:2]
    ex, ey = encoded
    if ex < nx or ey < ny:
        raise ToolError(ErrorCode.value_range, f"encoded matrix {ex}x{ey} is smaller than the image {nx}x{ny}",
                        arg="readout_oversampling")
    x0, y0 = (ex - nx) // 2, (ey - ny) // 2
    pads = [(x0, ex - nx - x0), (y0, ey - ny - y0)] + [(0, 0)] * (data.ndim - 2)
    affine = np.array(vol.affine, dtype=np.float64)
    affine[:3, 3] -= affine[:3, :3] @ np.array([x0, y0, 0.0])
    out = copy.copy(vol)
    out.data, out.affine = np.pad(data, pads), affine
    out.meta = dict(vol.meta)
    return out


def pad_in_plane(vol: Any, margin: float) -> Any:
    """Pad an Image/Cine/Mask with zeros by ``margin`` of its size on each side of X and Y,
    shifting the affine so every voxel keeps its world position (a larger field of view)."""
    if margin <= 0:
        return vol
    data = np.asarray(vol.data)
    mx, my = (int(round(margin * data.shape[i])) for i in (0, 1))
    pads = [(mx, mx), (my, my)] + [(0, 0)] * (data.ndim - 2)
    affine = np.array(vol.affine, dtype=np.float64)
    affine[:3, 3] -= affine[:3, :3] @ np.array([mx, my, 0.0])
    out = copy.copy(vol)
    out.data, out.affine = np.pad(data, pads), affine
    out.meta = dict(vol.meta, fov_padding_voxels=[mx, my])
    return out


def make_kspace_case(case_id: str, seed: int, size: Size = "small", domain: str = "cardiac",
                     R: int = 4, n_coils: int = 8, n_acs: int = 24, noise: float = 0.002,
                     pattern: Pattern = "regular", frames: Literal["all", "ed"] = "all",
                     fov_margin: float = 0.25, source_noise: float = 0.0, readout_oversampling: float = 1.0,
                     phase_oversampling: float = 1.0, family: str = "base", **kw: Any) -> Phantom:
    """A case whose only input sequence is ``KSPACE``; the fully sampled image is the truth.

    The source image (cardiac cine, prostate T2w or brain T2) is normalised to max 1 so recon
    metrics are comparable across cases. For cardiac, ``frames="ed"`` gives 3-D k-space of
    the ED frame instead of the whole cine.

    The field of view is padded by ``fov_margin`` on each in-plane side, as a scanner's FOV
    holds the object with air around it: coil images of an object cut by the FOV edge are not
    periodic, which no GRAPPA kernel or smooth coil map can model. The source image carries
    ``source_noise`` (default none): acquisition noise is added in k-space (``noise``).

    ``readout_oversampling`` (e.g. 2.0, as fastMRI's raw data) and ``phase_oversampling``
    (e.g. 1.14) make the encoded matrix larger than the recon matrix: k-space is simulated on
    the encoded grid (the padded image), and ``meta["recon_matrix"]`` says what to crop back
    (the padded source is exactly the centre crop, ``KSpace.recon_crop``), as in a fastMRI
    file whose ``reconstruction_rss`` is smaller than its k-space.

    ``family`` (``base``/``randomised``/``heldout``) is passed to the source generator; the
    k-space acquisition itself is the same for every family.

    Returns:
        Phantom with ``sequences={"KSPACE": KSpace}``, ``references={"KSPACE": clean image on the
        recon grid}`` (what an ideal reconstruction returns), the source's label maps on that
        grid, metadata ``recon_matrix``/``encoded_matrix`` and ``truth["kspace"]`` describing
        the acquisition.
    """
    if readout_oversampling < 1 or phase_oversampling < 1:
        raise ToolError(ErrorCode.value_range, "oversampling factors must be >= 1, got "
                        f"{readout_oversampling}, {phase_oversampling}", arg="readout_oversampling", case=case_id)
    if family != "base":
        kw["family"] = family
    src, img = _source_phantom(case_id, seed, size, domain, **{"noise": source_noise, **kw})
    if domain == "cardiac" and frames == "ed":
        img = img.frame(int(src.truth["ed_frame"]))
    src_grid = (img.affine, img.shape)
    img = pad_in_plane(img, fov_margin)
    data = np.asarray(img.data, dtype=np.float32)
    data = data / max(float(data.max()), 1e-12)
    clean = type(img)(data, img.affine.copy(), dict(img.meta, normalised=True))
    nx, ny = data.shape[:2]
    encoded = (2 * int(np.ceil(nx * readout_oversampling / 2)) if readout_oversampling > 1 else nx,
               2 * int(np.ceil(ny * phase_oversampling / 2)) if phase_oversampling > 1 else ny)
    acquired = oversample_in_plane(clean, encoded) if encoded != (nx, ny) else clean
    rng = np.random.default_rng([seed, 0x4B53])  # own stream: the anatomy draw stays unchanged
    ks, _ = make_kspace(acquired, n_coils, R, n_acs, noise, rng, pattern)
    ks.meta.update(case_id=case_id, domain=domain, source=KSPACE_SOURCES[domain][1])
    if encoded != (nx, ny):
        ks.meta.update(recon_matrix=[nx, ny], readout_oversampling=float(readout_oversampling),
                       phase_oversampling=float(phase_oversampling))
    truth = dict(src.truth)
    truth["kspace"] = {k: v for k, v in ks.meta.items() if k != "fft"} | {
        "reference": "KSPACE", "fft": FFT_CONVENTION, "encoded_matrix": list(encoded), "recon_matrix": [nx, ny]}
    # only label maps on the imaged grid describe the k-space case (prostate has ADC-grid ones too)
    labels = {k: pad_in_plane(m, fov_margin) for k, m in src.labels.items()
              if same_grid(m.affine, m.shape, *src_grid)}
    metadata = dict(src.metadata, recon_matrix=[nx, ny], encoded_matrix=list(encoded))
    return Phantom(case_id, domain, {"KSPACE": ks}, labels, metadata, truth, {"KSPACE": clean})
