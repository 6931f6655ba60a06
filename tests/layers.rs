//! The library's layering, read from its source with `syn` (every file, test modules
//! included, and the paths inside macro calls):
//!
//! 1. no module names a module of a higher layer, and none goes through the crate root's
//!    re-exports below the root (it names the defining module, so that every edge can be seen);
//! 2. no cycle between modules (a module naming its own parents does not count);
//! 3. every layer uses only the outside crates and `std` modules its row of [`OUTSIDE`]
//!    allows (threads, files, processes, sockets, `libc`, `nix`, `tokio`, …), and the protocol
//!    layer takes from `sync` only what [`PROTOCOL_FROM_SYNC`] lists;
//! 4. no code above the protocol layer touches an atomic of the shared header itself (a load,
//!    store or read-modify-write on a field of a structure of `protocol/abi.rs`), nor names a
//!    field of the header at all (`header().x`, or `h.x` for an `h` bound to a header): the
//!    rules of shared memory are the protocol's operations, and its figures are written and
//!    read through the protocol's typed writers and readers;
//! 5. every exception in [`KNOWN`] still occurs (so that the list only shrinks), and no other
//!    does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The layers, lowest first; a module may name its own layer and those below.
const LAYERS: [(&str, u8); 7] = [
    ("error", 0),    // the error types every layer returns
    ("sys", 1),      // every Linux call, as safe functions
    ("sync", 2),     // std or loom atomics, the word types, the traits of the OS (`Os`)
    ("protocol", 3), // the shared-memory ABI, framing, rings, park/wake: no OS
    ("region", 4),   // creating, opening, mapping regions; liveness; hand-off
    ("endpoint", 5), // producer, consumer, gate, partition, monitor, metrics
    ("net", 6),      // remote channels over TCP
];
/// `lib.rs`, its inline modules, and the loom models (`loom_models`, test-only).
const ROOT: u8 = 7;

/// What each layer may use from outside the crate: crates by name, `std` by module. What a
/// row does not name is refused. Every layer may use the pure parts of `std` ([`PURE_STD`]).
#[rustfmt::skip]
const OUTSIDE: [(u8, &[&str]); 8] = [
    (0, &[]),
    // Syscalls live here and only here.
    (1, &["libc", "nix", "memmap2", "std::os", "std::fs", "std::thread", "std::env", "std::path",
          "std::process"]),
    // The switch between std and loom.
    (2, &["loom"]),
    // No OS: atomics from `sync` only.
    (3, &[]),
    // Mappings (made by `sys::mem`, held here), descriptors, the environment of a child, a
    // pause between looks at a region still being created; the OS that waits need (`os`: the
    // CPU's yield, the doorbell's readiness in the tokio reactor) and the bridge thread.
    (4, &["memmap2", "std::os", "std::env", "std::path", "std::process", "std::fs",
          "std::thread", "tokio"]),
    // The flusher thread, async ends, descriptors handed in by callers, listing objects, the
    // pid an end publishes, the chunks a network bridge reads out (`bytes`), the padding of
    // state one thread writes and another reads and a backoff (`crossbeam_utils`).
    (5, &["tokio", "bytes", "std::thread", "std::os", "std::env", "std::fs", "std::path",
          "std::process", "crossbeam_utils"]),
    (6, &["tokio", "tokio_util", "bytes", "rustls", "tokio_rustls", "rustls_pki_types",
          "std::net", "std::os", "std::thread", "std::fs", "std::path", "crossbeam_utils"]),
    (7, &["*"]),
];

/// The parts of `std` that touch no OS resource (threads, files, sockets, processes, the
/// environment): every layer may use them.
#[rustfmt::skip]
const PURE_STD: [&str; 36] = [
    "any", "arch", "array", "borrow", "boxed", "cell", "char", "cmp", "collections", "convert",
    "default", "error", "ffi", "fmt", "future", "hash", "hint", "io", "iter", "marker", "mem",
    "num", "ops", "option", "panic", "pin", "ptr", "result", "slice", "str", "string", "sync",
    "task", "time", "vec", "alloc",
];

/// The only items the protocol layer may take from `sync`: atomics, their orderings, the
/// plain-memory fences, the word types that hold them, the traits through which the layer
/// above gives it the OS (`Os`, `AsyncOs`: interfaces, no OS code), and the clock deadlines are
/// measured against (`now`: the monotonic clock, or the loom model's).
#[rustfmt::skip]
const PROTOCOL_FROM_SYNC: [&str; 14] = [
    "AtomicU32", "AtomicU64", "Arc", "Mutex", "MutexGuard", "lock", "Ordering", "FutexWord",
    "spin_loop", "ByteTracker", "notifier_fence", "Os", "AsyncOs", "now",
];

/// Exceptions that exist today, each with why; the test fails when one of them is gone (take
/// it off the list) or a new one appears.
#[rustfmt::skip]
const KNOWN: [(&str, &str); 1] = [
    ("region::bridge -> loom", "the process-wide bridge is a lazy static, loom's under the \
      models (loom resets it between executions; std's `OnceLock` would carry one over)"),
];

fn layer_of(module: &[String]) -> Option<u8> {
    match module.first() {
        None => Some(ROOT),
        Some(m) if m == "loom_models" => Some(ROOT),
        Some(m) => LAYERS.iter().find(|(n, _)| n == m).map(|&(_, l)| l),
    }
}

/// The module a source file defines.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().map(String::as_str) == Some("mod") {
        parts.pop();
    }
    if parts == ["lib"] {
        parts.clear();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().unwrap() != "bin" {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// One use of a path, from `module`: a `use` tree flattened, a path in code, or one found in
/// a macro call's tokens.
struct Use {
    module: Vec<String>,
    path: Vec<String>,
    line: usize,
}

struct Collect {
    stack: Vec<Vec<String>>,
    uses: Vec<Use>,
    modules: BTreeSet<Vec<String>>,
    /// Atomic operations on a field: (module, field, method, line).
    atomics: Vec<(Vec<String>, String, String, usize)>,
    /// Fields named on a header: (module, field, line).
    header_fields: Vec<(Vec<String>, String, usize)>,
    /// Local names bound to a header (or a part of one) in the function being read.
    header_locals: Vec<BTreeSet<String>>,
}

/// The methods that hand out a region's header.
const HEADER_GETTERS: [&str; 2] = ["header", "gate_header"];

/// True if `e` is a header, or a part of one: a call of a header getter, a local bound to
/// one, or a field, reference or parenthesis of either.
fn of_header(e: &syn::Expr, locals: &BTreeSet<String>) -> bool {
    match e {
        syn::Expr::MethodCall(m) => HEADER_GETTERS.contains(&m.method.to_string().as_str()),
        syn::Expr::Path(p) => p
            .path
            .get_ident()
            .is_some_and(|i| locals.contains(&i.to_string())),
        syn::Expr::Field(f) => of_header(&f.base, locals),
        syn::Expr::Reference(r) => of_header(&r.expr, locals),
        syn::Expr::Paren(p) => of_header(&p.expr, locals),
        _ => false,
    }
}

/// The atomic operations that read or write shared memory.
const ATOMIC_OPS: [&str; 13] = [
    "load",
    "store",
    "swap",
    "fetch_add",
    "fetch_sub",
    "fetch_or",
    "fetch_and",
    "fetch_xor",
    "fetch_max",
    "fetch_min",
    "fetch_update",
    "compare_exchange",
    "compare_exchange_weak",
];

impl Collect {
    fn here(&self) -> Vec<String> {
        self.stack.last().unwrap().clone()
    }

    fn push(&mut self, path: Vec<String>, line: usize) {
        if !path.is_empty() {
            let module = self.here();
            self.uses.push(Use { module, path, line });
        }
    }

    fn tree(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree, line: usize) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut p = prefix.clone();
                if n.ident != "self" {
                    p.push(n.ident.to_string());
                }
                self.push(p, line);
            }
            syn::UseTree::Rename(r) => {
                let mut p = prefix.clone();
                p.push(r.ident.to_string());
                self.push(p, line);
            }
            syn::UseTree::Glob(_) => self.push(prefix.clone(), line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.tree(prefix, t, line);
                }
            }
        }
    }

    /// Paths in a macro call's tokens (`a::b::c` sequences), which `syn` leaves unparsed.
    fn tokens(&mut self, ts: proc_macro2::TokenStream) {
        let mut path: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        let flush = |c: &mut Collect, path: &mut Vec<String>, line: usize| {
            if path.len() > 1 {
                c.push(std::mem::take(path), line);
            }
            path.clear();
        };
        for t in ts {
            match t {
                proc_macro2::TokenTree::Ident(i) => {
                    if colons != 2 {
                        flush(self, &mut path, line);
                        line = i.span().start().line;
                    }
                    path.push(i.to_string());
                    colons = 0;
                }
                proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' && !path.is_empty() => {
                    colons += 1;
                }
                proc_macro2::TokenTree::Group(g) => {
                    flush(self, &mut path, line);
                    colons = 0;
                    self.tokens(g.stream());
                }
                _ => {
                    flush(self, &mut path, line);
                    colons = 0;
                }
            }
        }
        flush(self, &mut path, line);
    }
}

impl<'ast> Visit<'ast> for Collect {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let mut inner = self.here();
        inner.push(m.ident.to_string());
        self.modules.insert(inner.clone());
        if m.content.is_some() {
            self.stack.push(inner);
            syn::visit::visit_item_mod(self, m);
            self.stack.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        self.tree(&mut Vec::new(), &u.tree, line);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 || p.leading_colon.is_some() {
            let line = p.segments[0].ident.span().start().line;
            self.push(segs, line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        let method = m.method.to_string();
        if ATOMIC_OPS.contains(&method.as_str()) {
            if let syn::Expr::Field(f) = &*m.receiver {
                if let syn::Member::Named(field) = &f.member {
                    let line = m.method.span().start().line;
                    let here = self.here();
                    self.atomics.push((here, field.to_string(), method, line));
                }
            }
        }
        syn::visit::visit_expr_method_call(self, m);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.header_locals.push(BTreeSet::new());
        syn::visit::visit_item_fn(self, f);
        self.header_locals.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.header_locals.push(BTreeSet::new());
        syn::visit::visit_impl_item_fn(self, f);
        self.header_locals.pop();
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        if let (Some(init), syn::Pat::Ident(id)) = (&l.init, &l.pat) {
            let empty = BTreeSet::new();
            let locals = self.header_locals.last().unwrap_or(&empty);
            if of_header(&init.expr, locals) {
                if let Some(set) = self.header_locals.last_mut() {
                    set.insert(id.ident.to_string());
                }
            }
        }
        syn::visit::visit_local(self, l);
    }

    fn visit_expr_field(&mut self, f: &'ast syn::ExprField) {
        if let syn::Member::Named(field) = &f.member {
            let empty = BTreeSet::new();
            let locals = self.header_locals.last().unwrap_or(&empty);
            if of_header(&f.base, locals) {
                let line = field.span().start().line;
                let here = self.here();
                self.header_fields.push((here, field.to_string(), line));
            }
        }
        syn::visit::visit_expr_field(self, f);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        self.tokens(m.tokens.clone());
    }
}

/// Outside crates the library may name (any other first segment is a local name).
const CRATES: [&str; 14] = [
    "std",
    "core",
    "alloc",
    "libc",
    "nix",
    "memmap2",
    "bytemuck",
    "loom",
    "tokio",
    "tokio_util",
    "bytes",
    "rustls",
    "tokio_rustls",
    "rustls_pki_types",
];

fn outside_allowed(layer: u8, path: &[String]) -> Option<String> {
    let first = path[0].as_str();
    let key = match first {
        "core" | "alloc" | "bytemuck" => return None,
        "std" => {
            let second = path.get(1).map(String::as_str).unwrap_or("");
            if PURE_STD.contains(&second) {
                return None;
            }
            format!("std::{second}")
        }
        other => other.to_owned(),
    };
    let row = OUTSIDE.iter().find(|(l, _)| *l == layer).unwrap().1;
    if row.contains(&"*") || row.contains(&key.as_str()) {
        None
    } else {
        Some(key)
    }
}

/// A source file: the module it defines, where it is (for messages), its text.
struct Source {
    module: Vec<String>,
    path: String,
    text: String,
}

/// The library's own source files.
fn library() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .iter()
        .map(|f| Source {
            module: module_of(&src, f),
            path: f.strip_prefix(root).unwrap().display().to_string(),
            text: std::fs::read_to_string(f).unwrap(),
        })
        .collect()
}

#[test]
fn the_layers_hold() {
    let (problems, uses) = check(&library(), &KNOWN);
    let mut report = String::new();
    for p in &problems {
        writeln!(report, "{p}").unwrap();
    }
    assert!(
        problems.is_empty(),
        "layering: {} problem(s)\n{report}",
        problems.len()
    );
    assert!(uses > 1000, "the source was read: {uses} uses");
}

/// The check finds what it is for: each kind of violation, planted in a small tree.
#[test]
fn the_check_catches_each_kind_of_violation() {
    let src = |module: &str, text: &str| Source {
        module: module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        path: format!("{module}.rs"),
        text: text.into(),
    };
    let tree = [
        src(
            "",
            "mod error; mod sys; mod sync; mod protocol; mod region; mod endpoint;",
        ),
        src(
            "error",
            "#[cfg(test)] mod tests { use crate::endpoint::Thing; }",
        ),
        src("sys", "pub fn f() {}"),
        src("sync", "pub struct Bell; pub struct AtomicU32;"),
        src(
            "protocol",
            "use crate::sync::{AtomicU32, Bell}; fn f() { std::thread::yield_now(); \
             tokio::task::spawn(x); let _ = format!(\"{}\", crate::region::X); }",
        ),
        src(
            "region",
            "use crate::Error; use crate::endpoint::E; fn f() { libc::getpid(); }",
        ),
        src(
            "endpoint",
            "use crate::region::R; fn f(s: &S) { let h = s.header(); h.data_head.load(O); \
             self.own.load(O); s.header().idle_ns; let x = s.other(); x.idle_ns; }",
        ),
        src(
            "protocol::abi",
            "pub struct Header { pub data_head: AtomicU64, pub idle_ns: AtomicU64 }",
        ),
    ];
    let (problems, _) = check(&tree, &[("protocol -> tokio", "planted, known")]);
    let all = problems.join("\n");
    for want in [
        "layer 0 (error::tests) refers to layer 5 (endpoint)",
        "layer 3 (protocol) uses `std::thread::yield_now`",
        "takes `sync::Bell`",
        "layer 3 (protocol) refers to layer 4 (region)",
        "`crate::Error` goes through the crate root's re-exports",
        "layer 4 (region) refers to layer 5 (endpoint)",
        "layer 4 (region) uses `libc::getpid`",
        "cycle between modules: endpoint <-> region",
        "endpoint calls `load` on `data_head`, an atomic of the shared header",
        "endpoint names `idle_ns`, a field of the shared header",
    ] {
        assert!(all.contains(want), "missing {want:?} in:\n{all}");
    }
    assert!(
        !all.contains("tokio"),
        "a known exception is not a problem:\n{all}"
    );
    assert!(
        !all.contains("AtomicU32"),
        "atomics are the protocol's to take:\n{all}"
    );
    let (problems, _) = check(&tree[..1], &[("protocol -> tokio", "planted")]);
    assert!(
        problems.iter().any(|p| p.contains("no longer occurs")),
        "a known exception that is gone is reported: {problems:?}"
    );
}

/// Every problem of `sources`, and how many uses of a path were read.
fn check(sources: &[Source], known: &[(&str, &str)]) -> (Vec<String>, usize) {
    let mut c = Collect {
        stack: Vec::new(),
        uses: Vec::new(),
        modules: BTreeSet::new(),
        atomics: Vec::new(),
        header_fields: Vec::new(),
        header_locals: Vec::new(),
    };
    let mut file_of = BTreeMap::new();
    for f in sources {
        let ast = syn::parse_file(&f.text).unwrap_or_else(|e| panic!("{}: {e}", f.path));
        file_of.insert(f.module.clone(), f.path.clone());
        c.modules.insert(f.module.clone());
        c.stack.push(f.module.clone());
        c.visit_file(&ast);
        c.stack.pop();
    }
    let modules = c.modules.clone();
    let mut problems = Vec::new();
    let mut seen_known = BTreeSet::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    // An exception: known (noted as seen) or a problem.
    let add =
        |key: String, what: String, seen: &mut BTreeSet<String>, problems: &mut Vec<String>| {
            if known.iter().any(|(k, _)| *k == key) {
                seen.insert(key);
            } else {
                problems.push(what);
            }
        };
    // A module's layer is its file's (an inline module of `lib.rs` is the root's).
    let file_module = |m: &Vec<String>| {
        file_of
            .keys()
            .filter(|f| m.starts_with(f))
            .max_by_key(|f| f.len())
            .unwrap()
            .clone()
    };
    for u in &c.uses {
        let from = &u.module;
        let my_layer =
            layer_of(&file_module(from)).unwrap_or_else(|| panic!("module {from:?} has no layer"));
        let file = file_of
            .iter()
            .filter(|(m, _)| from.starts_with(m))
            .max_by_key(|(m, _)| m.len())
            .map(|(_, f)| f.clone())
            .unwrap_or_default();
        let at = format!("{file}:{}", u.line);
        let head = u.path[0].as_str();
        let (base, rest): (Vec<String>, &[String]) = match head {
            "crate" => (Vec::new(), &u.path[1..]),
            "self" => (from.clone(), &u.path[1..]),
            "super" => {
                let ups = u.path.iter().take_while(|s| *s == "super").count();
                (
                    from[..from.len().saturating_sub(ups)].to_vec(),
                    &u.path[ups..],
                )
            }
            h if CRATES.contains(&h) => {
                if let Some(key) = outside_allowed(my_layer, &u.path) {
                    let me = from.join("::");
                    add(
                        format!("{me} -> {key}"),
                        format!(
                            "{at}: layer {my_layer} ({me}) uses `{}`, which it may not",
                            u.path.join("::")
                        ),
                        &mut seen_known,
                        &mut problems,
                    );
                }
                continue;
            }
            _ => continue,
        };
        // The longest prefix that is a module.
        let mut target = base.clone();
        for part in rest {
            let mut t = target.clone();
            t.push(part.clone());
            if modules.contains(&t) {
                target = t;
            } else {
                break;
            }
        }
        if target.is_empty() {
            if my_layer != ROOT && head == "crate" {
                problems.push(format!(
                    "{at}: `{}` goes through the crate root's re-exports; name the defining module",
                    u.path.join("::")
                ));
            }
            continue;
        }
        if from.starts_with(&target) {
            continue; // itself or one of its parents
        }
        let to_layer = layer_of(&file_module(&target)).unwrap();
        if to_layer > my_layer {
            problems.push(format!(
                "{at}: layer {my_layer} ({}) refers to layer {to_layer} ({})",
                from.join("::"),
                target.join("::")
            ));
        }
        if my_layer == 3 && target[0] == "sync" {
            let after = u.path.iter().position(|s| s == "sync").unwrap() + 1;
            let item = u.path.get(after).cloned().unwrap_or_else(|| "*".into());
            if !PROTOCOL_FROM_SYNC.contains(&item.as_str()) {
                let me = from.join("::");
                add(
                    format!("{me} -> sync::{item}"),
                    format!("{at}: the protocol layer takes `sync::{item}`, which is not an atomic (waiting on the OS is injected from above)"),
                    &mut seen_known,
                    &mut problems,
                );
            }
        }
        // Edges between files' modules, for the cycle check (test modules count as their file).
        let from_file = file_of
            .keys()
            .filter(|m| from.starts_with(m))
            .max_by_key(|m| m.len())
            .unwrap()
            .clone();
        let to_file = file_of
            .keys()
            .filter(|m| target.starts_with(m))
            .max_by_key(|m| m.len())
            .unwrap()
            .clone();
        if !from_file.starts_with(&to_file) {
            edges.entry(from_file).or_default().insert(to_file);
        }
    }
    // The fields of the shared header's structures (`protocol/abi.rs`).
    let mut header_fields = BTreeSet::new();
    for f in sources.iter().filter(|f| f.module == ["protocol", "abi"]) {
        let ast = syn::parse_file(&f.text).unwrap();
        for item in &ast.items {
            if let syn::Item::Struct(st) = item {
                for field in &st.fields {
                    if let Some(id) = &field.ident {
                        header_fields.insert(id.to_string());
                    }
                }
            }
        }
    }
    for (module, field, method, line) in &c.atomics {
        let layer = layer_of(&file_module(module)).unwrap();
        // Tests, and the loom models' census (loads only), may look at anything.
        let in_test = module
            .iter()
            .any(|m| m == "tests" || m.ends_with("_tests") || m == "loom_models");
        if layer > 3 && !in_test && header_fields.contains(field) {
            let me = module.join("::");
            add(
                format!("{me} -> header.{field}"),
                format!(
                    "{}:{line}: {me} calls `{method}` on `{field}`, an atomic of the shared \
                     header: make it an operation of the protocol layer",
                    file_of[&file_module(module)]
                ),
                &mut seen_known,
                &mut problems,
            );
        }
    }
    for (module, field, line) in &c.header_fields {
        let layer = layer_of(&file_module(module)).unwrap();
        let in_test = module
            .iter()
            .any(|m| m == "tests" || m.ends_with("_tests") || m == "loom_models");
        if layer > 3 && !in_test && header_fields.contains(field) {
            let me = module.join("::");
            add(
                format!("{me} -> header.{field}"),
                format!(
                    "{}:{line}: {me} names `{field}`, a field of the shared header: write or \
                     read it through an operation of the protocol layer",
                    file_of[&file_module(module)]
                ),
                &mut seen_known,
                &mut problems,
            );
        }
    }
    for comp in cycles(&edges) {
        let mut names: Vec<String> = comp.iter().map(|m| m.join("::")).collect();
        names.sort();
        problems.push(format!("cycle between modules: {}", names.join(" <-> ")));
    }
    for (k, why) in known {
        if !seen_known.contains(*k) {
            problems.push(format!("`{k}` ({why}) no longer occurs: take it off KNOWN"));
        }
    }
    (problems, c.uses.len())
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct T<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        on: BTreeSet<Vec<String>>,
        stack: Vec<Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn strong(t: &mut T<'_>, v: &Vec<String>) {
        let i = t.index.len();
        t.index.insert(v.clone(), i);
        t.low.insert(v.clone(), i);
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        for w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                strong(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            strong(&mut t, v);
        }
    }
    t.out
}
