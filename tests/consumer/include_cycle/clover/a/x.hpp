// A fixture for include_folders.cmake: a -> b -> c -> a is a cycle; d and the top are not on it.
#include "clover/b/x.hpp"
#include "clover/d/x.hpp"
