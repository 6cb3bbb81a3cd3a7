#include "clover/a/x.hpp"
#include "clover/c/y.hpp"
