"""The image model of the independent evaluation family: grids, partial voluming, bias, noise.

Written apart from the training generators (``bcer.datasets.randomise``, ``degrade``,
``geometry``): its own grid builder, its own bias field (a product of random cosines rather
than a polynomial), its own Rician noise and its own orientation conventions. Anatomy is
given as a function from world points (RAS mm, shape (N, 3)) to integer labels; the image is
the mean over sub-samples along the slice profile of a per-label intensity, so a thick slice
mixes the tissues it spans, and the label map is the label at each voxel centre.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Anatomy = Callable[[np.ndarray], np.ndarray]  # world points (N, 3) -> int labels (N,)


@dataclass(frozen=True)
class Grid:
    """A voxel grid: ``shape`` (X, Y, Z) and the affine mapping (i, j, k, 1) to RAS mm."""

    shape: tuple[int, int, int]
    affine: np.ndarray

    @property
    def spacing(self) -> np.ndarray:
        return np.linalg.norm(self.affine[:3, :3], axis=0)

    @property
    def voxel_ml(self) -> float:
        return float(abs(np.linalg.det(self.affine[:3, :3]))) / 1000.0

    def points(self, offset_k: float = 0.0) -> np.ndarray:
        """World coordinates of every voxel centre (C order), shifted by ``offset_k`` voxels
        along the third (slice) axis."""
        ijk = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in self.shape], indexing="ij"), -1)
        ijk = ijk.reshape(-1, 3)
        ijk[:, 2] += offset_k
        return ijk @ self.affine[:3, :3].T + self.affine[:3, 3]


def centred_grid(axes: np.ndarray, spacing: tuple[float, float, float], shape: tuple[int, int, int],
                 centre: np.ndarray) -> Grid:
    """A grid whose voxel axes are the unit columns of ``axes`` (3x3), with the given spacing,
    shape, and its middle voxel at world point ``centre``."""
    m = np.asarray(axes, np.float64) * np.asarray(spacing, np.float64)[None, :]
    mid = (np.asarray(shape, np.float64) - 1.0) / 2.0
    aff = np.eye(4)
    aff[:3, :3] = m
    aff[:3, 3] = np.asarray(centre, np.float64) - m @ mid
    return Grid(tuple(int(n) for n in shape), aff)


def rotation(rng: np.random.Generator, max_deg: float) -> np.ndarray:
    """A rotation about a random axis by an angle uniform in [-max_deg, max_deg]."""
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    a = np.deg2rad(rng.uniform(-max_deg, max_deg))
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(a) * k + (1 - np.cos(a)) * k @ k


def sample_labels(grid: Grid, anatomy: Anatomy, thickness_vox: float, n_sub: int = 3) -> list[np.ndarray]:
    """Labels at ``n_sub`` points spread across a slice profile ``thickness_vox`` voxels wide
    (a value below 1 is a slice gap); the middle one (odd ``n_sub``) is at the voxel centres."""
    offsets = np.linspace(-0.5, 0.5, n_sub) * thickness_vox if n_sub > 1 else np.zeros(1)
    return [anatomy(grid.points(off)).reshape(grid.shape) for off in offsets]


def shade(subs: list[np.ndarray], intensity: dict[int, float]) -> np.ndarray:
    """The mean over the sub-sample label maps of a per-label intensity (partial voluming)."""
    keys = np.array(sorted(intensity))
    lut = np.zeros(int(keys.max()) + 1)
    lut[keys] = [intensity[int(k)] for k in keys]
    return sum(lut[s] for s in subs) / len(subs)


def render(grid: Grid, anatomy: Anatomy, intensity: dict[int, float], thickness_vox: float,
           n_sub: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(image, labels) on ``grid``: labels at voxel centres, the image shaded over ``n_sub``
    points across each slice's profile (partial voluming of thick slices)."""
    subs = sample_labels(grid, anatomy, thickness_vox, n_sub)
    return shade(subs, intensity), subs[len(subs) // 2].astype(np.int16)


def cosine_bias(grid: Grid, rng: np.random.Generator, strength: float, wavelength_mm: float) -> np.ndarray:
    """A smooth multiplicative field: exp of a sum of four random plane cosines, scaled so its
    log spans about ±``strength``."""
    pts = grid.points()
    pts = pts - pts.mean(axis=0)
    log_field = np.zeros(len(pts))
    for _ in range(4):
        k = rng.normal(size=3)
        k *= 2 * np.pi / (wavelength_mm * np.linalg.norm(k))
        log_field += np.cos(pts @ k + rng.uniform(0, 2 * np.pi))
    return np.exp(strength * log_field / 4.0).reshape(grid.shape)


def rician(img: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """Magnitude of the image plus complex Gaussian noise of SD ``sigma`` per channel."""
    re = img + rng.normal(0.0, sigma, img.shape)
    im = rng.normal(0.0, sigma, img.shape)
    return np.sqrt(re * re + im * im)


def acquire(grid: Grid, subs: list[np.ndarray], intensity: dict[int, float], rng: np.random.Generator,
            bias: float, noise: float, scale: float, wavelength_mm: float = 250.0) -> np.ndarray:
    """Shade the sampled labels (``sample_labels``), apply a bias field and Rician noise
    (``noise`` relative to the brightest tissue), and scale to scanner units (float32)."""
    img = shade(subs, intensity) * cosine_bias(grid, rng, bias, wavelength_mm)
    img = rician(img, rng, noise * max(intensity.values()))
    return (img * scale).astype(np.float32)


def oriented(axes_choice: str, rng: np.random.Generator) -> np.ndarray:
    """Voxel axes (unit columns) for an orientation convention:

    ``ras`` identity; ``lps`` (DICOM-like: x and y flipped); ``brats`` diag(-1, -1, 1) as BraTS
    2021 files carry; ``permuted`` a random axis order with random flips; ``sagittal`` slices
    across x (axis order y, z, x)."""
    if axes_choice == "ras":
        return np.eye(3)
    if axes_choice in ("lps", "brats"):
        return np.diag([-1.0, -1.0, 1.0])
    if axes_choice == "sagittal":
        return np.eye(3)[:, [1, 2, 0]] * np.array([1.0, -1.0, 1.0])[None, :]
    if axes_choice == "permuted":
        perm = rng.permutation(3)
        while (perm == np.arange(3)).all():
            perm = rng.permutation(3)
        return np.eye(3)[:, perm] * rng.choice([-1.0, 1.0], 3)[None, :]
    raise ValueError(f"unknown orientation {axes_choice!r}")


def voxel_box(mask: np.ndarray) -> list[list[int]]:
    """[[min i, j, k], [max + 1]]: the half-open box of a mask's voxels."""
    idx = np.argwhere(mask)
    return [idx.min(axis=0).tolist(), (idx.max(axis=0) + 1).tolist()]


def max_diameter_mm(mask: np.ndarray, affine: np.ndarray) -> float:
    """The largest distance between two voxel centres of a mask (mm), on at most 800 points."""
    pts = np.argwhere(mask).astype(np.float64)
    if len(pts) < 2:
        return float(np.linalg.norm(affine[:3, :3], axis=0).max()) if len(pts) else 0.0
    if len(pts) > 800:
        pts = pts[np.linspace(0, len(pts) - 1, 800).astype(int)]
    w = pts @ affine[:3, :3].T
    d = np.sqrt(((w[:, None, :] - w[None, :, :]) ** 2).sum(-1))
    return float(d.max())


__all__ = ["Anatomy", "Grid", "acquire", "centred_grid", "cosine_bias", "max_diameter_mm", "oriented", "render",
           "rician", "rotation", "sample_labels", "shade", "voxel_box"]
