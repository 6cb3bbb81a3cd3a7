#include <clover/c/x.hpp>
