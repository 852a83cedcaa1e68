// The parameter store moved to triax/params/param_store.h (a level below model and optim, which
// both use it); this header forwards there for code written against the old path.
#pragma once
#include "triax/params/param_store.h"
