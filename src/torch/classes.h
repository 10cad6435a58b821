// Registering a loaded op library's custom classes as torchbind classes (Note [Custom classes]
// in opforge/op_class.h).
#pragma once

#include "opforge/c_api.h"

namespace opforge::torch {

/// Registers every class of `lib` (whose ops are registered already) as
/// `torch.classes.<ns>.<Class>`: one attribute per field, `__init__` (running the constructor
/// op, or keeping the declared fields after checking them against the method ops' parameter
/// constraints), one method per declared method (running its op through the dispatcher with the
/// object's fields bound), `__getstate__`/`__setstate__` (the fields as a tuple) and
/// `__obj_flatten__` (the fields as (name, value) pairs). The caller has checked that no class
/// of these names is registered with torch.
void register_classes(const OpforgeLibrary& lib);

}  // namespace opforge::torch
