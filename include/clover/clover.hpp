#pragma once
// Everything a user needs: include this one header.
#include "clover/core/error.hpp"
#include "clover/decode/generate.hpp"
#include "clover/io/gguf.hpp"
#include "clover/model/model.hpp"
#include "clover/arch/dims.hpp"
