"""ExCP (transitional: the single-file module moved to container.py; the next commit splits it)."""

from . import container as _container

globals().update({k: v for k, v in vars(_container).items() if not k.startswith("__")})
__all__ = _container.__all__
