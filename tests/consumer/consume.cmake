# Builds and runs tests/consumer/project against clover, one way (MODE = subdirectory | package).
set(work "${WORK_DIR}/${MODE}")
file(REMOVE_RECURSE "${work}")
set(args -S "${SOURCE_DIR}/tests/consumer/project" -B "${work}/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCLOVER_CONSUME=${MODE} -DCLOVER_SOURCE_DIR=${SOURCE_DIR})
if(MODE STREQUAL "package")
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${work}/clover-build" -G Ninja
                            -DCLOVER_BUILD_TESTS=OFF -DCLOVER_BUILD_EXAMPLES=OFF -DCLOVER_BUILD_BENCHMARKS=OFF
                    RESULT_VARIABLE rc)
    if(rc) message(FATAL_ERROR "configuring clover for install failed") endif()
    execute_process(COMMAND ${CMAKE_COMMAND} --install "${work}/clover-build" --prefix "${work}/prefix" RESULT_VARIABLE rc)
    if(rc) message(FATAL_ERROR "installing clover failed") endif()
    list(APPEND args "-DCMAKE_PREFIX_PATH=${work}/prefix")
endif()
foreach(step IN ITEMS configure build run)
    if(step STREQUAL "configure")
        execute_process(COMMAND ${CMAKE_COMMAND} ${args} RESULT_VARIABLE rc)
    elseif(step STREQUAL "build")
        execute_process(COMMAND ${CMAKE_COMMAND} --build "${work}/build" RESULT_VARIABLE rc)
    else()
        execute_process(COMMAND "${work}/build/consumer" "${work}/tiny.gguf" RESULT_VARIABLE rc)
    endif()
    if(rc) message(FATAL_ERROR "consumer (${MODE}): ${step} failed") endif()
endforeach()
