"""What machine a run was made on (evalpipe/machine.py): the first CPU's model name and the
vector extensions kernels are chosen by are read from /proc/cpuinfo's text, a machine
without a model name still gets a name, and the one-line description says what a record
has (older records lack the CPU)."""

from __future__ import annotations

import platform

from evalpipe.machine import ISA_FLAGS, cpu_model_and_flags, describe, one_line

CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon Gold\nflags\t\t: fpu amx_tile avx2 avx512_bf16\n\n"
           "processor\t: 1\nmodel name\t: Other\nflags\t\t: avx512f\n")


def test_the_first_cpu_s_model_and_flags():
    model, flags = cpu_model_and_flags(CPUINFO)
    assert model == "Xeon Gold" and flags == {"fpu", "amx_tile", "avx2", "avx512_bf16"}


def test_the_isa_lists_only_the_kernel_flags_in_their_order():
    hw = describe(CPUINFO)
    assert hw["isa"] == ["avx2", "avx512_bf16", "amx_tile"] and set(hw["isa"]) <= set(ISA_FLAGS)
    assert hw["machine"] == platform.machine() and hw["system"] == platform.system() and hw["cpus"] >= 1


def test_a_cpuinfo_without_a_model_name_still_names_the_machine():
    model, flags = cpu_model_and_flags("processor\t: 0\nFeatures\t: fp asimd\n")
    assert model == (platform.processor() or platform.machine()) and model and flags == set()


def test_one_line_says_what_the_record_has():
    assert one_line({"cpu": "Xeon Gold", "isa": ["avx2"], "cpus": 2, "machine": "x86_64", "system": "Linux"}) == \
        "Xeon Gold (avx2), 2 CPUs, x86_64 Linux"
    assert one_line({"cpu": "Xeon Gold", "isa": [], "cpus": 2, "machine": "x86_64", "system": "Linux"}) == \
        "Xeon Gold, 2 CPUs, x86_64 Linux"
    assert one_line({}) == "? CPUs, ?"
