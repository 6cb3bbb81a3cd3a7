#include "clover/a/x.hpp"
