# The `docs` target: the API reference of the headers a user includes, by Doxygen (Debian's
# doxygen; scripts/setup.sh installs it), into ${PROJECT_BINARY_DIR}/docs/api/html. Doxygen fails
# on any warning (docs/Doxyfile.in), so the `docs` test (label docs, a second or two) keeps these
# headers documented. Without doxygen there is neither target nor test.
find_program(DOXYGEN_EXECUTABLE doxygen)
if(NOT DOXYGEN_EXECUTABLE)
    message(STATUS "doxygen not found: no `docs` target")
    return()
endif()
set(CLOVER_DOCS_OUT "${PROJECT_BINARY_DIR}/docs/api")
set(clover_docs_headers clover.hpp model/open.hpp model/model.hpp model/stage.hpp model/session.hpp decode/decoders.hpp decode/generate.hpp
    decode/engine.hpp dist/communicator.hpp dist/local.hpp dist/message.hpp pipeline/pipeline.hpp pipeline/serve.hpp
    pipeline/split.hpp pipeline/protocol.hpp)
set(CLOVER_DOCS_INPUT "")
foreach(h IN LISTS clover_docs_headers)
    string(APPEND CLOVER_DOCS_INPUT " \"${PROJECT_SOURCE_DIR}/include/clover/${h}\"")
endforeach()
configure_file("${PROJECT_SOURCE_DIR}/docs/Doxyfile.in" "${PROJECT_BINARY_DIR}/docs/Doxyfile" @ONLY)
file(MAKE_DIRECTORY "${CLOVER_DOCS_OUT}")
add_custom_target(docs
    COMMAND "${DOXYGEN_EXECUTABLE}" "${PROJECT_BINARY_DIR}/docs/Doxyfile"
    WORKING_DIRECTORY "${PROJECT_BINARY_DIR}/docs"
    COMMENT "API reference: ${CLOVER_DOCS_OUT}/html/index.html"
    VERBATIM)
if(CLOVER_BUILD_TESTS)
    add_test(NAME docs COMMAND "${DOXYGEN_EXECUTABLE}" "${PROJECT_BINARY_DIR}/docs/Doxyfile"
             WORKING_DIRECTORY "${PROJECT_BINARY_DIR}/docs")
    set_tests_properties(docs PROPERTIES LABELS docs TIMEOUT 120)
endif()
