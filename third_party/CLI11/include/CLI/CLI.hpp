// Copyright (c) 2017-2021, University of Cincinnati, developed by Henry Schreiner
// under NSF AWARD 1414736 and by the respective contributors.
// All rights reserved.
//
// SPDX-License-Identifier: BSD-3-Clause

#pragma once

// CLI Library includes
// Order is important for combiner script

#include "Version.hpp"

#include "Macros.hpp"

#include "StringTools.hpp"

#include "Error.hpp"

#include "TypeTools.hpp"

#include "Split.hpp"

#include "ConfigFwd.hpp"

#include "Validators.hpp"

#include "FormatterFwd.hpp"

#include "Option.hpp"

#include "App.hpp"

#include "Config.hpp"

#include "Formatter.hpp"
