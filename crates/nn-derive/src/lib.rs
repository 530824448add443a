//! `#[derive(Module)]` for kiln-nn: a layer declares each parameter once, on its field, and the
//! derive writes the `ModuleParams` visitors (`visit`, `visit_mut`, `visit_tensors`, `set_training`)
//! from them.
//!
//! Field attributes (a field without one is not part of the parameter tree):
//! - `#[param]`: a trainable tensor (`ParamKind::Weight`), a `Tensor` or an `Option<Tensor>` (a
//!   `None` is skipped, as an absent bias).
//! - `#[buffer]`: a saved but untrained tensor (`ParamKind::Buffer`), same types, or a
//!   `RefCell<Tensor>` that a `&self` forward updates (BatchNorm's running statistics).
//! - `#[module]`: a child whose own parameters are visited under `field.` (anything implementing
//!   `ModuleParams`: a layer, `Vec<T>` with children named `0`, `1`, ..., `Option<T>`,
//!   `Box<dyn Module>`). `set_training` is passed on to it.
//! - `#[training]`: a `bool` field that `set_training` sets.
//!
//! `#[param(rename = "weight_ih_l0")]` (also on `buffer` and `module`) names the entry other than
//! its field, and `#[module(flatten)]` visits a child's parameters under this module's own names,
//! with no prefix. Entries are visited in field order, so the declaration order is the order of
//! the state dict and of the optimizers' state.
//!
//! The generated code names the crate `::kiln_nn` (kiln-nn declares `extern crate self as kiln_nn`
//! to use its own derive).

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitStr, parse_macro_input, spanned::Spanned};

/// Generates `kiln_nn::ModuleParams` for a struct with named fields; see the crate docs for the
/// field attributes.
#[proc_macro_derive(Module, attributes(param, buffer, module, training))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// What one field contributes to the parameter tree.
enum Entry {
    /// A tensor (or optional tensor) of the given kind, under `name`.
    Tensor { field: syn::Ident, name: String, buffer: bool },
    /// A child module, under `name` (empty when flattened).
    Child { field: syn::Ident, name: String },
    /// A `bool` that `set_training` sets.
    Training { field: syn::Ident },
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let mut entries = Vec::new();
    match &input.data {
        Data::Struct(data) if matches!(data.fields, Fields::Named(_)) => {
            for field in &data.fields {
                if let Some(entry) = field_entry(field)? {
                    entries.push(entry);
                }
            }
        }
        // Tuple and unit structs, enums and unions have no field names to name tensors by: they
        // derive an empty parameter tree (an activation, a pooling layer), and a parameter
        // attribute on one of their fields is an error.
        _ => {
            for field in other_fields(&input.data) {
                if let Some(attr) = field.attrs.iter().find(|attr| is_role(attr)) {
                    return Err(syn::Error::new(
                        attr.span(),
                        "parameter attributes need a struct with named fields (a field's name is its entry's name)",
                    ));
                }
            }
        }
    }

    let krate = quote!(::kiln_nn);
    let mut visit = Vec::new();
    let mut visit_mut = Vec::new();
    let mut visit_tensors = Vec::new();
    let mut training = Vec::new();
    for entry in &entries {
        match entry {
            Entry::Tensor { field, name, buffer } => {
                let kind = if *buffer { quote!(#krate::ParamKind::Buffer) } else { quote!(#krate::ParamKind::Weight) };
                visit.push(quote!(#krate::__derive::ParamSlot::visit_slot(&self.#field, #name, #kind, f);));
                visit_mut.push(quote!(#krate::__derive::ParamSlot::visit_slot_mut(&mut self.#field, #name, #kind, f);));
                visit_tensors.push(quote!(#krate::__derive::ParamSlot::visit_slot_tensor(&self.#field, #kind, f);));
            }
            Entry::Child { field, name } => {
                visit.push(quote!(#krate::__derive::visit_child(&self.#field, #name, f);));
                visit_mut.push(quote!(#krate::__derive::visit_child_mut(&mut self.#field, #name, f);));
                visit_tensors.push(quote!(#krate::ModuleParams::visit_tensors(&self.#field, f);));
                training.push(quote!(#krate::ModuleParams::set_training(&mut self.#field, training);));
            }
            Entry::Training { field } => training.push(quote!(self.#field = training;)),
        }
    }
    let set_training = (!training.is_empty()).then(|| {
        quote! {
            fn set_training(&mut self, training: bool) {
                #(#training)*
            }
        }
    });
    let f = if visit.is_empty() { quote!(_f) } else { quote!(f) };
    let name = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::ModuleParams for #name #type_generics #where_clause {
            fn visit(&self, #f: &mut dyn FnMut(&str, &#krate::__derive::Tensor, #krate::ParamKind)) {
                #(#visit)*
            }

            fn visit_mut(&mut self, #f: &mut dyn FnMut(&str, &mut #krate::__derive::Tensor, #krate::ParamKind)) {
                #(#visit_mut)*
            }

            fn visit_tensors(&self, #f: &mut dyn FnMut(&#krate::__derive::Tensor, #krate::ParamKind)) {
                #(#visit_tensors)*
            }

            #set_training
        }
    })
}

/// The fields of anything but a struct with named fields.
fn other_fields(data: &Data) -> Vec<&syn::Field> {
    match data {
        Data::Struct(data) => data.fields.iter().collect(),
        Data::Enum(data) => data.variants.iter().flat_map(|variant| variant.fields.iter()).collect(),
        Data::Union(data) => data.fields.named.iter().collect(),
    }
}

/// Whether `attr` is one of the derive's field attributes.
fn is_role(attr: &syn::Attribute) -> bool {
    ROLES.iter().any(|role| attr.path().is_ident(role))
}

/// The field attributes, one per field at most.
const ROLES: [&str; 4] = ["param", "buffer", "module", "training"];

/// The entry `field` declares through its attribute, if any; more than one of them is an error.
fn field_entry(field: &syn::Field) -> syn::Result<Option<Entry>> {
    let Some(ident) = field.ident.clone() else { return Ok(None) };
    let mut entry = None;
    for attr in &field.attrs {
        let path = attr.path();
        let role = ROLES.into_iter().find(|role| path.is_ident(role));
        let Some(role) = role else { continue };
        if entry.is_some() {
            return Err(syn::Error::new(
                attr.span(),
                "a field takes one of #[param], #[buffer], #[module], #[training]",
            ));
        }
        let options = options(attr, role == "module")?;
        let name = options.rename.unwrap_or_else(|| ident.to_string());
        entry = Some(match role {
            "param" | "buffer" => Entry::Tensor { field: ident.clone(), name, buffer: role == "buffer" },
            "module" => Entry::Child { field: ident.clone(), name: if options.flatten { String::new() } else { name } },
            _ => {
                if !matches!(attr.meta, syn::Meta::Path(_)) {
                    return Err(syn::Error::new(attr.span(), "#[training] takes no options"));
                }
                Entry::Training { field: ident.clone() }
            }
        });
    }
    Ok(entry)
}

/// The options inside `#[role(...)]`.
#[derive(Default)]
struct Options {
    rename: Option<String>,
    flatten: bool,
}

fn options(attr: &syn::Attribute, allow_flatten: bool) -> syn::Result<Options> {
    let mut options = Options::default();
    if matches!(attr.meta, syn::Meta::Path(_)) {
        return Ok(options);
    }
    attr.parse_nested_meta(|meta| {
        if meta.path.is_ident("rename") {
            let name: LitStr = meta.value()?.parse()?;
            if name.value().is_empty() || name.value().contains('.') {
                return Err(syn::Error::new(name.span(), "a name is non-empty and has no `.`"));
            }
            options.rename = Some(name.value());
            Ok(())
        } else if allow_flatten && meta.path.is_ident("flatten") {
            options.flatten = true;
            Ok(())
        } else {
            let expected = if allow_flatten { "`rename = \"...\"` or `flatten`" } else { "`rename = \"...\"`" };
            Err(meta.error(format!("unknown option, expected {expected}")))
        }
    })?;
    if options.flatten && options.rename.is_some() {
        return Err(syn::Error::new(Span::call_site(), "`flatten` and `rename` exclude each other"));
    }
    Ok(options)
}
