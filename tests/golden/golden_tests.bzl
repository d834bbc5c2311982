"""The golden families' tests: moe-align against the references, moe-mesh-check against one rank."""

BF16_REFERENCE = "bf16/{family}.safetensors"
BF16_SPREAD = "bf16/{family}.transformers_bf16.safetensors"

def align_test(family, name = None, flags = [], files = [], script = "align_test.sh"):
    """moe-align on a golden family with `flags` ($(rootpath) of `files` allowed in them)."""
    native.sh_test(
        name = name or "align_" + family,
        size = "small",
        srcs = [script],
        args = ["$(rootpath :moe-align)", "$(rootpath @golden//:" + family + "/config.json)"] + flags,
        data = files + [":moe-align", "@golden//:" + family + "/config.json", "@golden//:files"],
    )

def align_bf16_test(family, name = None, script = "align_test.sh"):
    """moe-align in bf16 storage against the bf16-weight reference, transformers' bf16 as the noise floor."""
    reference = BF16_REFERENCE.format(family = family)
    spread = BF16_SPREAD.format(family = family)
    align_test(
        family,
        name = name or "align_" + family + "_bf16",
        flags = ["--dtype", "bfloat16", "--golden", "$(rootpath " + reference + ")",
                 "--bf16-spread", "$(rootpath " + spread + ")"],
        files = [reference, spread],
        script = script,
    )

def mesh_test(family, name, mesh, flags = [], files = [], script = "mesh_test.sh"):
    """moe-mesh-check: a golden family on `mesh` (with `flags`) equals one rank."""
    native.sh_test(
        name = "mesh_" + family + "_" + name,
        size = "small",
        srcs = [script],
        args = ["$(rootpath :moe-mesh-check)", "$(rootpath @golden//:" + family + "/config.json)",
                "--mesh", mesh] + flags,
        data = files + [":moe-mesh-check", "@golden//:" + family + "/config.json", "@golden//:files"],
    )
