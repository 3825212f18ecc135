"""Serve: the env server, its worker pool, the env client and the wire codec (the only package importing zmq)."""

from tracegym.serve.curve import AuthenticationError
from tracegym.serve.env_client import EnvClient
from tracegym.serve.env_server import EnvServer
from tracegym.serve.local_server import local_server
from tracegym.serve.pool import PoolSize
from tracegym.serve.wire import RemoteError

__all__ = ["AuthenticationError", "EnvClient", "EnvServer", "PoolSize", "RemoteError", "local_server"]
