# gpt_eval against HuggingFace: scripts/hf_check.py builds a random GPT2LMHeadModel (or, without
# transformers, a plain-torch GPT-2), saves it as safetensors and compares gpt_eval's loss at np 1
# and 2 with it (1e-5 relative). Skipped (77) where the Python has no torch (Debian: python3-torch).
# TRIAX_HF_PYTHON picks the interpreter, e.g. a venv with transformers:
#   python3 -m venv --system-site-packages /tmp/hfenv && /tmp/hfenv/bin/pip install transformers==4.40.2 safetensors
#   cmake -DTRIAX_HF_PYTHON=/tmp/hfenv/bin/python ...
if(DEFINED ENV{TRIAX_HF_PYTHON})
  set(_hf_python_default "$ENV{TRIAX_HF_PYTHON}")
else()
  set(_hf_python_default "/usr/bin/python3")
endif()
set(TRIAX_HF_PYTHON "${_hf_python_default}" CACHE FILEPATH "Python with torch (and transformers) for scripts/hf_check.py")
if(TARGET gpt_eval AND TRIAX_WITH_MPI AND EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME eval.hf_check
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/hf_check.py $<TARGET_FILE:gpt_eval>
            --mpirun ${MPIEXEC_EXECUTABLE} --np 1,2)
  set_tests_properties(eval.hf_check PROPERTIES LABELS "eval;dist" TIMEOUT 300 PROCESSORS 2
    SKIP_RETURN_CODE 77 ENVIRONMENT "${TRIAX_MPIRUN_ENV}")
endif()
