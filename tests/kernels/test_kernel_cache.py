"""Where MLX keeps compiled CUDA kernels (locals' cache unless the user chose a place), and how many
CUDA graphs."""

import os

import mlx.core as mx

from locals.engine.kernels import cubin
from locals.engine.load.backend import CUDA_GRAPH_CACHE, cuda_launch_settings, keep_compiled_kernels


def test_compiled_kernels_go_to_the_locals_cache_per_mlx_version(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALS_HOME", str(tmp_path))
    monkeypatch.delenv("MLX_PTX_CACHE_DIR", raising=False)  # restored after the test
    keep_compiled_kernels()
    assert os.environ["MLX_PTX_CACHE_DIR"] == str(tmp_path / "cache" / "cuda-kernels" / mx.__version__)


def test_mlx_launches_cuda_kernels_without_graphs_and_keeps_more_unless_the_user_chose(monkeypatch):
    for name in ("MLX_USE_CUDA_GRAPHS", "MLX_CUDA_GRAPH_CACHE_SIZE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    cuda_launch_settings()
    assert os.environ["MLX_USE_CUDA_GRAPHS"] == "0"
    assert os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] == str(CUDA_GRAPH_CACHE)
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "1")
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "400")
    cuda_launch_settings()
    assert (os.environ["MLX_USE_CUDA_GRAPHS"], os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"]) == ("1", "400")


def test_tuning_times_kernels_in_cuda_graphs_and_a_model_loaded_after_keeps_them(monkeypatch):
    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)  # restored after the test
    cuda_launch_settings(graphs=True)  # `locals tune`, first
    cuda_launch_settings()  # its load_model, after
    assert os.environ["MLX_USE_CUDA_GRAPHS"] == "1"


def test_a_users_own_kernel_cache_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALS_HOME", str(tmp_path))
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", "/elsewhere")
    keep_compiled_kernels()
    assert os.environ["MLX_PTX_CACHE_DIR"] == "/elsewhere"


def test_an_unwritable_cache_leaves_mlx_its_default(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LOCALS_HOME", str(blocker))  # cache_dir() cannot be created under a file
    monkeypatch.delenv("MLX_PTX_CACHE_DIR", raising=False)
    keep_compiled_kernels()
    assert "MLX_PTX_CACHE_DIR" not in os.environ


def test_locals_keeps_its_own_cubins_in_a_folder_of_that_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(cubin, "_SHARED", [])  # this process's store, made again under this cache
    store = cubin.shared_store()
    if cubin.find_nvrtc() is None:  # no NVRTC here: MLX compiles locals' kernels itself
        assert store is None
    else:
        assert store.folder == tmp_path / "kernels" / "locals"
    assert cubin.shared_store() is store  # one per process


def test_a_process_first_kernel_trims_the_cubins_kept(tmp_path, monkeypatch):
    ours = tmp_path / "kernels" / "locals"
    ours.mkdir(parents=True)
    for i in range(3):  # oldest first
        (ours / f"k{i}.cubin").write_bytes(b"x" * 100)
        os.utime(ours / f"k{i}.cubin", (1000 + i, 1000 + i))
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(cubin, "_SHARED", [])
    monkeypatch.setattr(cubin, "DISK_CAP_BYTES", 250)
    cubin.shared_store()
    assert sorted(p.name for p in ours.iterdir()) == ["k1.cubin", "k2.cubin"]
