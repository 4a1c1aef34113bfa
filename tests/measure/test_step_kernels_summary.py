"""benchmarks/step_kernels.py's reading of Nsight Compute's raw CSV (no GPU needed)."""

from __future__ import annotations


from benchmarks.step_kernels import family, summarize

HEADER = '"ID","Kernel Name","gpu__time_duration.sum"'
BYTES_HEADER = '"ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"'


def test_family_drops_templates_parameters_and_namespaces():
    assert family("void mlx::core::cu::copy_v<float, float>(const float *, float *, long)") == "copy_v"
    assert family("custom_kernel_locals_qmma_ab_bfloat16_t_8_1_256_64_f_1") == (
        "custom_kernel_locals_qmma_ab_bfloat16_t_8_1_256_64_f_1")


def test_time_only_summary_groups_per_family_and_step():
    csv_text = "\n".join([
        "==PROF== Connected to process",  # ncu's own lines are skipped
        HEADER, '"","","nsecond"',
        '"0","void cu::copy_v<float>(float *)","2,000"',
        '"1","void cu::copy_v<float>(float *)","4000"',
        '"2","qmm_kernel","30000"',
    ])
    out = summarize(csv_text, steps=2)
    assert out["kernels_per_step"] == 1.5 and out["device_us_per_step"] == 18.0
    assert [f["name"] for f in out["families"]] == ["qmm_kernel", "copy_v"]
    assert out["families"][1] == {"name": "copy_v", "per_step": 1.0, "us_per_step": 3.0}


def test_bytes_give_megabytes_per_step_and_bandwidth():
    csv_text = "\n".join([
        BYTES_HEADER, '"","","byte","byte","nsecond"',
        '"0","qmm_kernel","14000000","64000","10000"',  # 14 MB read in 10 us
        '"1","qmm_kernel","14000000","64000","10000"',
    ])
    out = summarize(csv_text, steps=2)
    entry = out["families"][0]
    assert entry["read_mb_per_step"] == 14.0 and entry["write_mb_per_step"] == 0.06
    assert entry["gb_per_s"] == 1406.4  # (14 + 0.064) MB in 10 us
