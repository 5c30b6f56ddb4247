"""VocAgnoLM for LitGPT: vocabulary-agnostic teacher-guided language modeling (Shin et al., ICML 2025).

Kept free of imports: the `.pth` hook may import this package in any Python process.
"""

__version__ = "0.1.0"
