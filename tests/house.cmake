# The house rules: every #include points down the layers of scripts/check_layers.py
# (docs/ARCHITECTURE.md draws them), checked on the tree and shown to fail on upward includes.
add_test(NAME house.layers COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/house/layers_test.sh)
set_tests_properties(house.layers PROPERTIES TIMEOUT 60 LABELS "house")
