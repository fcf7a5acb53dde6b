"""The data directory's lock (server/data_dir.py) within one process: a second open is refused, naming the holder."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trireme.server.broker import Broker
from trireme.server.config import Config
from trireme.server.data_dir import DataDirInUse, DataDirLock
from trireme.server.startup import StartupError, StartupInterrupted


def test_second_lock_in_the_same_process_is_refused(tmp_path):
    lock = DataDirLock.acquire(str(tmp_path), "127.0.0.1:9092")
    try:
        with pytest.raises(DataDirInUse) as refused:
            DataDirLock.acquire(str(tmp_path), "127.0.0.1:9093")
        message = str(refused.value)
        assert "a broker in this process" in message and f"pid={os.getpid()} " in message
        assert "listen=127.0.0.1:9092" in message and str(tmp_path) in message
        assert (tmp_path / ".lock").read_text().startswith(f"pid={os.getpid()} ")
    finally:
        lock.release()
    again = DataDirLock.acquire(str(tmp_path), "127.0.0.1:9093")      # released: free again
    assert "listen=127.0.0.1:9093" in (tmp_path / ".lock").read_text()
    again.release()
    assert not again.held


def test_another_process_is_refused_while_held(tmp_path):
    lock = DataDirLock.acquire(str(tmp_path), "127.0.0.1:9092")
    try:
        probe = ("import sys; from trireme.server.data_dir import DataDirLock, DataDirInUse\n"
                 "try:\n    DataDirLock.acquire(sys.argv[1], 'x:1')\n"
                 "except DataDirInUse as e:\n    print(e)\n    sys.exit(3)\n")
        result = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True)
        assert result.returncode == 3, result
        assert "another broker" in result.stdout and f"pid={os.getpid()} " in result.stdout
    finally:
        lock.release()


def test_broker_holds_the_lock_until_closed(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))
    with pytest.raises(DataDirInUse):
        Broker(Config(data_dir=str(tmp_path)))
    broker.close()
    Broker(Config(data_dir=str(tmp_path))).close()


def test_failed_start_gives_the_lock_back(tmp_path):
    Broker(Config(data_dir=str(tmp_path))).close()
    config = Config(data_dir=str(tmp_path))
    config.set("node.id", 5)
    with pytest.raises(StartupError, match="meta.properties"):
        Broker(config)
    Broker(Config(data_dir=str(tmp_path))).close()      # not left locked by the failed start


def test_stop_requested_while_loading(tmp_path):
    broker = Broker(Config(data_dir=str(tmp_path)))
    broker.ensure_topic("t", 3)
    broker.close()
    with pytest.raises(StartupInterrupted):
        Broker(Config(data_dir=str(tmp_path)), stop_requested=lambda: True)
    Broker(Config(data_dir=str(tmp_path))).close()


def test_the_lock_a_dead_brokers_child_still_holds_is_waited_for(tmp_path):
    """A killed broker's cleaner child inherited its locked file (server/log_cleaner.py): the next broker waits
    for the child to be gone instead of working beside it; a live holder is refused as before."""
    # A "broker" process takes the lock, starts a child that inherits the locked file and lingers a second, and
    # dies at once.
    script = ("import os, subprocess, sys\nfrom trireme.server.data_dir import DataDirLock\n"
              "lock = DataDirLock.acquire(sys.argv[1], 'x:1')\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.0)'], "
              "pass_fds=(lock.fileno(),))\n"
              "print(child.pid, flush=True)\nos._exit(0)\n")
    dead = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    child = int(dead.stdout.split()[0])
    assert os.path.exists(f"/proc/{child}") or sys.platform != "linux"
    lock = DataDirLock.acquire(str(tmp_path), "127.0.0.1:9092")       # waits for the child to end
    try:
        assert not os.path.exists(f"/proc/{child}/cwd") or sys.platform != "linux"
        assert (tmp_path / ".lock").read_text().startswith(f"pid={os.getpid()} ")
    finally:
        lock.release()
