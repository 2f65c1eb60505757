//! Every kernel launch in the device files of src/gpu/ (`DEVICE_FILES`) against the kernel's signature in kernels/*.cu,
//! without a GPU: as many arguments as parameters, a device buffer where the kernel takes a
//! pointer (of the same element type, where the buffer's type can be read off its field)
//! and a plain value where it takes a value. cudarc cannot check this (its launch arguments
//! are untyped), and none of these launches has run on a GPU yet: a forgotten or swapped
//! argument would otherwise first show there, as wrong numbers or a fault.

use std::collections::HashMap;
use std::path::Path;

/// One kernel parameter: a pointer (and its element type) or a value.
#[derive(Debug, Clone, PartialEq)]
struct Param {
    pointer: bool,
    /// The C type without qualifiers or `*`: "double", "unsigned long long", ...
    base: String,
}

/// The parameters of every `extern "C" __global__` kernel in the .cu files.
fn kernel_signatures(root: &Path) -> HashMap<String, Vec<Param>> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(root.join("kernels")).unwrap().flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("cu") {
            continue;
        }
        // Without comments (some parameters carry one, with commas and parentheses) or the
        // line continuations of a macro.
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                l.split("//")
                    .next()
                    .unwrap()
                    .trim_end_matches('\\')
                    .to_string()
                    + "\n"
            })
            .collect();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("extern \"C\" __global__ void ") {
            rest = &rest[at + "extern \"C\" __global__ void ".len()..];
            // Launch bounds, if any, come before the name.
            if let Some(bounds) = rest.strip_prefix("__launch_bounds__(") {
                rest = &bounds[bounds.find(')').unwrap() + 1..];
            }
            let open = rest.find('(').unwrap();
            let close = rest.find(')').unwrap();
            let name = rest[..open].trim().to_string();
            let params = rest[open + 1..close]
                .split(',')
                .map(|p| {
                    let words: Vec<&str> = p
                        .split_whitespace()
                        .filter(|w| !matches!(*w, "const" | "__restrict__"))
                        .collect();
                    let pointer = p.contains('*');
                    // The last word is the parameter's name.
                    let base = words[..words.len() - 1].join(" ").replace('*', "");
                    Param {
                        pointer,
                        base: base.trim().to_string(),
                    }
                })
                .collect();
            out.insert(name, params);
        }
    }
    out
}

/// The Rust element type of a C base type.
fn rust_type(c: &str) -> &'static str {
    match c {
        "double" => "f64",
        "float" => "f32",
        "unsigned" => "u32",
        "int" => "i32",
        "unsigned long long" => "u64",
        "unsigned char" => "u8",
        "float4" => "float4",
        other => panic!("a kernel parameter of type {other}: add it here"),
    }
}

/// The contents of the balanced parenthesis group that `text` starts with (`text[0] == '('`).
fn group(text: &str) -> &str {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[1..i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses");
}

/// The suffix type of `expr` when it ends in a cast or a typed literal (`x as u32`, `0i32`).
fn cast_type(expr: &str) -> Option<String> {
    let expr = expr.trim().trim_end_matches([';', ',', ')']).trim();
    if let Some((_, ty)) = expr.rsplit_once(" as ") {
        return Some(ty.trim().to_string());
    }
    ["u32", "i32", "u64", "f64", "f32"]
        .into_iter()
        .find(|t| {
            expr.strip_suffix(t)
                .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// The type of the value `name` holds where `before` ends (the nearest binding above it:
/// a `let` with a cast, a tuple of casts, a `for` over typed literals, a typed parameter);
/// `None` when the binding does not say.
fn value_type(before: &str, name: &str) -> Option<String> {
    let is_name = |w: &str| w.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_')) == name;
    let lines: Vec<&str> = before.lines().collect();
    for (i, line) in lines.iter().enumerate().rev() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("for ") {
            let (var, range) = rest.split_once(" in ")?;
            if is_name(var) {
                let first = range.trim_start_matches('[').split([',', '.']).next()?;
                return cast_type(first);
            }
            continue;
        }
        if let Some(rest) = t.strip_prefix("let ") {
            let Some((pattern, value)) = rest.split_once(" = ") else {
                continue;
            };
            let pattern = pattern.trim_start_matches("mut ");
            if pattern.starts_with('(') {
                let names: Vec<&str> = pattern.trim_matches(['(', ')']).split(", ").collect();
                let Some(k) = names.iter().position(|n| is_name(n)) else {
                    continue;
                };
                // The tuple's values, perhaps over several lines up to `);`.
                let mut text = value.to_string();
                for more in &lines[i + 1..] {
                    if text.trim_end().ends_with(';') {
                        break;
                    }
                    text.push(' ');
                    text.push_str(more.trim());
                }
                let inner = text.trim().trim_end_matches(';').trim();
                let inner = inner.strip_prefix('(')?.strip_suffix(')')?;
                let values: Vec<&str> = inner.split(", ").collect();
                return values.get(k).and_then(|v| cast_type(v));
            }
            if let Some((var, ty)) = pattern.split_once(": ") {
                if var == name {
                    return Some(ty.to_string());
                }
                continue;
            }
            if pattern == name {
                return cast_type(value);
            }
            if pattern.starts_with('[') && pattern.split(", ").any(is_name) {
                return None;
            }
            continue;
        }
        // A parameter `name: T,` of the enclosing function.
        if let Some(ty) = t.strip_prefix(&format!("{name}: ")) {
            return Some(ty.trim_end_matches([',', ')']).to_string());
        }
    }
    None
}

/// The files of src/gpu/ that hold the kernel table and launch kernels.
const DEVICE_FILES: [&str; 7] = [
    "context.rs",
    "buffers.rs",
    "state.rs",
    "tree.rs",
    "traversal.rs",
    "passes.rs",
    "payload.rs",
];

#[test]
fn every_launch_matches_its_kernels_signature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernels = kernel_signatures(root);
    let device: String = DEVICE_FILES
        .iter()
        .map(|f| std::fs::read_to_string(root.join("src/gpu").join(f)).unwrap())
        .collect::<Vec<_>>()
        .join("\n");

    // Kernels: `field: function("file.cu", "kernel")?`.
    let mut functions: HashMap<String, String> = HashMap::new();
    for line in device.lines() {
        let line = line.trim();
        if let Some((field, call)) = line.split_once(": function(") {
            let kernel = call.split('"').nth(3).unwrap();
            functions.insert(field.to_string(), kernel.to_string());
        }
    }
    assert!(functions.len() >= 20, "{} kernels found", functions.len());
    // The rotated M2L kernels (m2l_rotated.cu defines one per order with a macro) are
    // launched where m2l_cells is, with its arguments.
    let rotated = kernels
        .get("m2l_rotated_##P")
        .expect("m2l_rotated.cu's kernel macro");
    assert_eq!(
        Some(rotated),
        kernels.get("m2l_cells"),
        "m2l_rotated_P and m2l_cells take the same arguments"
    );

    // Buffer fields and their element types (`name: Reused<T>`, `CudaSlice<T>`, arrays of
    // two); a name declared with two types is not checked.
    let mut fields: HashMap<String, Option<String>> = HashMap::new();
    for line in device.lines() {
        let line = line
            .trim()
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ");
        let Some((name, ty)) = line.split_once(": ") else {
            continue;
        };
        let ty = ty.trim_end_matches(',');
        let element = ["Reused<", "CudaSlice<", "[Reused<"]
            .iter()
            .find_map(|p| ty.strip_prefix(p))
            .and_then(|t| t.split('>').next());
        if let (Some(element), true) = (
            element,
            name.chars().all(|c| c.is_alphanumeric() || c == '_'),
        ) {
            let entry = fields
                .entry(name.to_string())
                .or_insert(Some(element.to_string()));
            if entry.as_deref() != Some(element) {
                *entry = None;
            }
        }
    }
    // Locals that stand for buffers: the field they come from.
    let mut aliases: HashMap<&str, &str> = [
        ("keys_a", "keys"),
        ("keys_b", "keys"),
        ("keys_in", "keys"),
        ("keys_out", "keys"),
        ("index_a", "index"),
        ("index_b", "index"),
        ("index_in", "index"),
        ("index_out", "index"),
        ("handed", "deferred"),
        ("next", "deferred"),
        ("handed_spans", "deferred_spans"),
        ("next_spans", "deferred_spans"),
        ("which", "retry"),
        ("out", "acc"),
        ("by", "vel"),
        ("from", "acc"),
        ("to", "acc"),
        ("m2l_spans", "m2l_spans"),
        ("p2p_spans", "p2p_spans"),
        ("m2l_sources", "m2l_sources"),
        ("p2p_sources", "p2p_sources"),
    ]
    .into_iter()
    .collect();
    // And the views `let view = x.field.buf.slice(..)` / `slice_mut`.
    for line in device.lines() {
        let Some((name, value)) = line
            .trim()
            .strip_prefix("let ")
            .and_then(|l| l.split_once(" = "))
        else {
            continue;
        };
        let name = name.trim_start_matches("mut ");
        if let Some((path, _)) = value.split_once(".buf.slice") {
            aliases.insert(name, path.rsplit('.').next().unwrap());
        }
    }
    // The buffer an argument names, if it is one: the field before `.buf`, a field of the
    // state or the sort buffers, or an alias.
    let buffer = |arg: &str| -> Option<String> {
        let path = arg
            .trim_start_matches('&')
            .trim_start_matches("mut ")
            .trim();
        let path = path.trim_end_matches(".buf");
        let last = path.rsplit('.').next().unwrap();
        let last = last.split('[').next().unwrap();
        match aliases.get(last) {
            Some(field) => Some(field.to_string()),
            None if path.contains('.') || arg.contains(".buf") => Some(last.to_string()),
            None => None,
        }
    };

    let (mut launches, mut pointers, mut typed, mut values, mut typed_values) = (0, 0, 0, 0, 0);
    let mut rest = device.as_str();
    while let Some(at) = rest.find("launch_builder(") {
        rest = &rest[at + "launch_builder".len()..];
        let target = group(rest).trim();
        let field = target.rsplit('.').next().unwrap();
        // add_scaled launches kick or drift, which share a signature.
        let kernel = if target == "kernel" {
            "kick".to_string()
        } else {
            functions
                .get(field)
                .unwrap_or_else(|| panic!("launch of unknown kernel {target}"))
                .clone()
        };
        let params = kernels
            .get(&kernel)
            .unwrap_or_else(|| panic!("no kernel {kernel} in kernels/*.cu"));
        let launch_at = device.len() - rest.len();
        let end = rest.find("launch.launch(").expect("the launch");
        let body = &rest[..end];
        let mut args = Vec::new();
        let mut scan = body;
        while let Some(a) = scan.find(".arg(") {
            scan = &scan[a + ".arg".len()..];
            args.push(group(scan).trim().to_string());
        }
        assert_eq!(
            args.len(),
            params.len(),
            "{kernel}: {} arguments for {} parameters: {args:?}",
            args.len(),
            params.len()
        );
        for (i, (arg, param)) in args.iter().zip(params).enumerate() {
            match (buffer(arg), param.pointer) {
                (Some(field), true) => {
                    pointers += 1;
                    if let Some(Some(element)) = fields.get(&field) {
                        typed += 1;
                        assert_eq!(
                            element,
                            rust_type(&param.base),
                            "{kernel}: argument {i} ({arg}) holds {element}, the kernel takes {}*",
                            param.base
                        );
                    }
                }
                (None, false) => {
                    values += 1;
                    let name = arg.trim_start_matches('&');
                    if let Some(ty) = value_type(&device[..launch_at], name) {
                        typed_values += 1;
                        assert_eq!(
                            ty,
                            rust_type(&param.base),
                            "{kernel}: argument {i} ({arg}) is a {ty}, the kernel takes {}",
                            param.base
                        );
                    }
                }
                (b, _) => panic!(
                    "{kernel}: argument {i} ({arg}) is {} where the kernel takes {}{}",
                    if b.is_some() { "a buffer" } else { "a value" },
                    param.base,
                    if param.pointer { "*" } else { "" }
                ),
            }
        }
        launches += 1;
    }
    println!(
        "{launches} launches, {pointers} buffer arguments, {typed} of them of a known type, {values} value arguments, {typed_values} of them of a known type"
    );
    assert!(launches >= 25, "{launches} launches found");
    assert_eq!(typed, pointers, "buffers of unknown type");
}
