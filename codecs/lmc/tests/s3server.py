"""A real S3 endpoint for the tests: moto's standalone server on 127.0.0.1, started by the fixture (as s3fs's
own tests do), reached by clients through AWS_ENDPOINT_URL alone."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

BUCKET = "lmc-test"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", name="s3")
def s3_server(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 and the environment that points clients at it."""
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "moto.server"]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.2)
        import s3fs
        # fsspec caches filesystem instances by their arguments, not by the environment: one made for an
        # earlier module's server (another port) would be handed out again
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        yield env
    finally:
        with contextlib.suppress(ImportError):
            import s3fs
            s3fs.S3FileSystem.clear_instance_cache()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        log.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
