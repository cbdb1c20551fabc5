import re

from setuptools import find_packages, setup


def read_version():
    """__version__ from fairseq_memattn/__init__.py, without importing it (that needs fairseq)."""
    with open("fairseq_memattn/__init__.py", encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


setup(
    name="fairseq_memattn",
    version=read_version(),
    description="fairseq plugin: fixed-size memory attention (Britz, Guan & Luong, EMNLP 2017)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: MIT License",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["fairseq_memattn", "fairseq_memattn.*"]),
    python_requires=">=3.10",
    # torch is not pinned here: install the build you want first (CPU or CUDA).
    # fairseq is not listed either, so that pip never replaces your own fairseq
    # checkout; choose a distribution explicitly (see README, "Install").
    # torch 2.4: add_safe_globals (checkpoint_safety) and torch.is_autocast_enabled(device).
    # sacremoses: undoing the tokenisation and truecasing of the WMT'17 preprocessed corpora.
    # sentencepiece 0.2: its normalizer alone (recipes.wmt17's test for a line without text).
    install_requires=["torch>=2.4", "numpy", "sacrebleu>=2.0", "sentencepiece>=0.2", "sacremoses",
                      "matplotlib>=3.6"],
    entry_points={"console_scripts": [f"fairseq-memattn-{tool} = fairseq_memattn.cli.{tool}:main" for tool in
                                      ("plot", "score", "export", "convert", "translate", "serve")]},
    extras_require={
        # fairseq's upstream main (0.12.3) built for CPython 3.11/3.12.
        "ve-fairseq": ["ve-fairseq==0.12.3"],
        "test": ["pytest", "pytest-xdist", "filelock", "hypothesis"],
        # fairseq-memattn-export and fairseq_memattn.deploy (ONNX Runtime); never needed for training.
        # The translator alone needs numpy, onnxruntime and sentencepiece: docs/deploying.md installs
        # it with --no-deps, without torch and fairseq.
        "deploy": ["onnx", "onnxruntime"],
        # fairseq-memattn-serve, the HTTP server over the translator.
        "serve": ["aiohttp>=3.9"],
    },
)
