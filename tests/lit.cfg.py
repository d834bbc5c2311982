# lit configuration for MoEC's compiler tests, run one file at a time by //bazel:run_lit.sh.
import os

import lit.formats

config.name = "MoEC"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.environ.get("TEST_TMPDIR", "/tmp")
config.environment["PATH"] = os.environ["PATH"]
config.environment["FILECHECK_OPTS"] = "--enable-var-scope --dump-input=fail"
root = os.environ.get("MOEC_SRC_ROOT", "")
# %root: the source tree (models/, shared inputs); %inputs: the Inputs/ folder beside the test.
config.substitutions.append(("%root", root))
config.substitutions.append(("%inputs", os.path.join(os.environ.get("MOEC_TEST_SRC_DIR", ""), "Inputs")))
