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

# The Llama family against an fp64 reference: scripts/hf_llama_check.py writes a random Llama
# (GQA, SwiGLU, RoPE with llama3 scaling, untied head) as HF directories (f32 single file, bf16
# sharded index), compares gpt_eval's loss and every --grads-out gradient at np 1, 2, 4 with torch
# autograd in float64, trains it with --init-from at tp2 x pp2 x dp2 and at np 1 (equal losses),
# and reloads the --export-hf directory; with transformers, LlamaForCausalLM agrees as well.
if(TARGET gpt_eval AND TARGET train_gpt AND TRIAX_WITH_MPI AND EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME eval.hf_llama_check
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/scripts/hf_llama_check.py $<TARGET_FILE:gpt_eval>
            $<TARGET_FILE:train_gpt> --mpirun ${MPIEXEC_EXECUTABLE} --np 1,2,4 --train-np 8)
  set_tests_properties(eval.hf_llama_check PROPERTIES LABELS "eval;dist" TIMEOUT 300 PROCESSORS 2
    SKIP_RETURN_CODE 77 ENVIRONMENT "${TRIAX_MPIRUN_ENV}")
endif()
