#!/usr/bin/env node
// `steadfast` as the try-it package installs it: the steadfast command of the controller's
// package (its dependency), whose `demo`, `lab` and `simulate` find the try-it tools in this
// package. Everything else (`steadfast controller`, `steadfast agent`, the operator commands) is
// the controller package's own.
'use strict';
require('steadfast/bin/steadfast.js');
