//===- import_error_wrong_type.mlir - config values of the wrong JSON type ===//

// Tests that a string where an integer belongs names the file, the key and both kinds.
// RUN: not moec import %inputs/wrong_type_hidden_size.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=HIDDEN
// HIDDEN: moec: error: {{.*}}/Inputs/wrong_type_hidden_size.json: key 'hidden_size': expected an integer, got a string

// Tests that a type error inside a nested object names the nested key.
// RUN: not moec import %inputs/wrong_type_rope_theta.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=THETA
// THETA: moec: error: {{.*}}/Inputs/wrong_type_rope_theta.json: key 'rope_parameters.rope_theta': expected a number, got a string

// Tests that a list with an element of the wrong type names the element's kind.
// RUN: not moec import %inputs/wrong_type_layer_types.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=LIST
// LIST: moec: error: {{.*}}/Inputs/wrong_type_layer_types.json: key 'layer_types': expected a list of strings, but an element is a number
