//! A small read-only element tree built with quick-xml's `NsReader`: every element and attribute
//! carries its resolved namespace URI and the line it starts on, so the domain reader can enforce
//! namespaces and name lines in its messages.

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, XmlVersion};

use crate::error::ConfigError;

/// Deepest nesting accepted (a libvirt domain is a few levels deep; this bounds memory and
/// keeps hostile input from building a huge tree of empty elements).
pub const MAX_DEPTH: usize = 64;
/// Most elements accepted in one document.
pub const MAX_ELEMENTS: usize = 100_000;

/// One attribute (namespace declarations are not kept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Namespace URI (unprefixed attributes have none).
    pub ns: Option<String>,
    /// Local name.
    pub name: String,
    /// Value, unescaped.
    pub value: String,
}

/// One element with its direct text (concatenated, untrimmed) and children.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// Namespace URI (`None`: no namespace, as libvirt's own elements).
    pub ns: Option<String>,
    /// Local name.
    pub name: String,
    /// Attributes in document order.
    pub attrs: Vec<Attr>,
    /// Direct text content.
    pub text: String,
    /// Child elements in document order.
    pub children: Vec<Element>,
    /// 1-based line of the element's `<`.
    pub line: u32,
}

impl Element {
    /// The value of the un-namespaced attribute `name`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|a| a.ns.is_none() && a.name == name)
            .map(|a| a.value.as_str())
    }

    /// The element's text without surrounding whitespace.
    pub fn trimmed_text(&self) -> &str {
        self.text.trim()
    }
}

/// Maps byte offsets to 1-based line numbers (offsets are asked for in increasing order).
struct Lines<'a> {
    input: &'a str,
    pos: usize,
    line: u32,
}

impl Lines<'_> {
    fn at(&mut self, offset: u64) -> u32 {
        let offset = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.input.len());
        if offset < self.pos {
            // Not expected; recount from the start rather than report a wrong line.
            self.pos = 0;
            self.line = 1;
        }
        let skipped = &self.input.as_bytes()[self.pos..offset];
        self.line += skipped.iter().filter(|&&b| b == b'\n').count() as u32;
        self.pos = offset;
        self.line
    }
}

fn namespace(r: ResolveResult<'_>, what: &str, line: u32) -> Result<Option<String>, ConfigError> {
    match r {
        ResolveResult::Unbound => Ok(None),
        ResolveResult::Bound(ns) => Ok(Some(ns.into_inner().to_string())),
        ResolveResult::Unknown(prefix) => Err(ConfigError::Xml {
            line,
            message: format!("{what} uses the undeclared namespace prefix `{prefix}`"),
        }),
    }
}

fn element(
    reader: &NsReader<&[u8]>,
    start: &BytesStart<'_>,
    line: u32,
) -> Result<Element, ConfigError> {
    let xml_err = |e: quick_xml::Error| ConfigError::Xml {
        line,
        message: e.to_string(),
    };
    let (ns, local) = reader.resolver().resolve_element(start.name());
    let name = local.into_inner().to_string();
    let ns = namespace(ns, &format!("<{}>", start.name().into_inner()), line)?;
    let mut attrs = Vec::new();
    for a in start.attributes() {
        let a = a.map_err(|e| xml_err(e.into()))?;
        let qname = a.key.into_inner();
        if qname == "xmlns" || qname.starts_with("xmlns:") {
            continue;
        }
        let (ans, alocal) = reader.resolver().resolve_attribute(a.key);
        let ans = namespace(ans, &format!("attribute `{qname}`"), line)?;
        let value = a
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(xml_err)?
            .into_owned();
        let attr_name = alocal.into_inner().to_string();
        if attrs
            .iter()
            .any(|x: &Attr| x.ns == ans && x.name == attr_name)
        {
            return Err(ConfigError::Xml {
                line,
                message: format!("<{name}> has the attribute `{qname}` twice"),
            });
        }
        attrs.push(Attr {
            ns: ans,
            name: attr_name,
            value,
        });
    }
    Ok(Element {
        ns,
        name,
        attrs,
        text: String::new(),
        children: Vec::new(),
        line,
    })
}

/// Parses `input` into its root element. Errors name the line; a document with no root, two
/// roots, text outside the root, or an unknown entity is an error.
pub fn parse(input: &str) -> Result<Element, ConfigError> {
    let mut reader = NsReader::from_str(input);
    let config = reader.config_mut();
    config.trim_text(false);
    config.expand_empty_elements = false;
    config.check_end_names = true;
    let mut lines = Lines {
        input,
        pos: 0,
        line: 1,
    };
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    let mut count = 0usize;
    loop {
        let before = reader.buffer_position();
        let event = reader.read_event();
        let line = lines.at(before);
        let event = event.map_err(|e| {
            let at = reader.error_position();
            let mut l = Lines {
                input,
                pos: 0,
                line: 1,
            };
            ConfigError::Xml {
                line: l.at(at),
                message: e.to_string(),
            }
        })?;
        let open =
            |e: &BytesStart<'_>| -> Result<Element, ConfigError> { element(&reader, e, line) };
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                if root.is_some() {
                    return Err(ConfigError::Xml {
                        line,
                        message: "content after the root element".into(),
                    });
                }
                count += 1;
                if count > MAX_ELEMENTS {
                    return Err(ConfigError::Xml {
                        line,
                        message: format!("more than {MAX_ELEMENTS} elements"),
                    });
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(ConfigError::Xml {
                        line,
                        message: format!("elements nest deeper than {MAX_DEPTH} levels"),
                    });
                }
                let el = open(e)?;
                if matches!(event, Event::Start(_)) {
                    stack.push(el);
                } else {
                    close(&mut stack, &mut root, el);
                }
            }
            Event::End(_) => {
                // check_end_names guarantees a matching start.
                if let Some(el) = stack.pop() {
                    close(&mut stack, &mut root, el);
                }
            }
            Event::Text(t) => {
                let text = t.xml10_content();
                push_text(&mut stack, &text, line)?;
            }
            Event::CData(c) => {
                let text = c.xml10_content();
                push_text(&mut stack, &text, line)?;
            }
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    Ok(None) => {
                        let name = r.xml10_content();
                        quick_xml::escape::resolve_predefined_entity(&name)
                            .ok_or_else(|| ConfigError::Xml {
                                line,
                                message: format!("unknown entity `&{name};`"),
                            })?
                            .to_string()
                    }
                    Err(e) => {
                        return Err(ConfigError::Xml {
                            line,
                            message: e.to_string(),
                        })
                    }
                };
                push_text(&mut stack, &resolved, line)?;
            }
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    if let Some(open) = stack.last() {
        return Err(ConfigError::Xml {
            line: open.line,
            message: format!("<{}> is never closed", open.name),
        });
    }
    root.ok_or(ConfigError::Xml {
        line: 1,
        message: "no root element (empty document?)".into(),
    })
}

fn close(stack: &mut [Element], root: &mut Option<Element>, el: Element) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None => *root = Some(el),
    }
}

fn push_text(stack: &mut [Element], text: &str, line: u32) -> Result<(), ConfigError> {
    match stack.last_mut() {
        Some(el) => {
            el.text.push_str(text);
            Ok(())
        }
        None if text.trim().is_empty() => Ok(()),
        None => Err(ConfigError::Xml {
            line,
            message: "text outside the root element".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_lines_and_entities() {
        let doc = "<?xml version='1.0'?>\n<a x='1'>\n  <p:b xmlns:p='urn:p' p:y='2'>t&amp;&#65;</p:b>\n  <c/>\n</a>\n";
        let root = parse(doc).unwrap();
        assert_eq!(
            (root.name.as_str(), root.ns.as_deref(), root.line),
            ("a", None, 2)
        );
        assert_eq!(root.attr("x"), Some("1"));
        let b = &root.children[0];
        assert_eq!(
            (b.name.as_str(), b.ns.as_deref(), b.line),
            ("b", Some("urn:p"), 3)
        );
        assert_eq!(b.attrs[0].ns.as_deref(), Some("urn:p"));
        assert_eq!(
            b.attr("y"),
            None,
            "namespaced attribute is not the plain one"
        );
        assert_eq!(b.text, "t&A");
        assert_eq!(root.children[1].line, 4);
    }

    #[test]
    fn errors_name_the_line() {
        let e = |doc: &str| parse(doc).unwrap_err().to_string();
        assert!(
            e("<a>\n<b>\n</a>").contains("line 3"),
            "{}",
            e("<a>\n<b>\n</a>")
        );
        assert!(e("<a>\n<q:b/>\n</a>").contains("line 2"));
        assert!(e("<a>\n<q:b/>\n</a>").contains("undeclared namespace prefix `q`"));
        assert!(e("<a>&nope;</a>").contains("unknown entity"));
        assert!(e("").contains("no root element"));
        assert!(e("<a/><b/>").contains("after the root"));
        assert!(e("<a>\n<b>").contains("never closed"));
        let dup = e("<a x='1' x='2'/>");
        assert!(dup.contains("line 1") && dup.contains("duplicate"), "{dup}");
        let deep = "<a>".repeat(MAX_DEPTH + 1);
        assert!(e(&deep).contains("nest deeper"));
    }
}
