#pragma once
/// \file
/// Everything a user needs: include this one header (opening files, the model, sessions, the
/// decoders and the generation loops).
#include "clover/core/error.hpp"
#include "clover/decode/generate.hpp"
#include "clover/io/gguf.hpp"
#include "clover/model/model.hpp"
#include "clover/schema/dims.hpp"

/// \namespace clover
/// The library: opening model files (clover::open, clover::load), the model (clover::model) and
/// its sequences (clover::session).
/// \namespace clover::decode
/// The decoder policies (ar, low_confidence, self_speculative) and the generation loops over them
/// (generate, generate_many).
