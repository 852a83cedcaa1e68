# Expert-parallel MoE block equals the serial (ep = 1) block on every rank's tokens: outputs, aux
# loss, input gradients, router and expert gradients; k = 1, 2; drop and no-drop; chunks 1, 2, 4;
# GELU experts with biases and SwiGLU experts without (Mixtral, HF names).
triax_add_multirank_test(test_moe_ep SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_ep.cpp NP 1 2 4 TIMEOUT 120)
# Expert gradients reduced over expert_dp (sum / dp), dense over dp; the norm counts experts once.
triax_add_multirank_test(test_moe_grad_sync SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_grad_sync.cpp NP 1 2 4 TIMEOUT 120)
# Mixtral-shaped MoE (Llama block, SwiGLU experts) in bf16 on cpu-emulated: within 0.5% of float32.
triax_add_multirank_test(test_moe_mixtral SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_mixtral.cpp NP 1 TIMEOUT 300)
