# The installed tree works for a separate project: find_package(triax) + triax::triax.
add_test(NAME install.find_package
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install_test.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR}/examples)
set_tests_properties(install.find_package PROPERTIES TIMEOUT 600 LABELS install RUN_SERIAL TRUE)
