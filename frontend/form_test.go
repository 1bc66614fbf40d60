package frontend_test

import (
	"net/url"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// formValues returns what a browser submits for the form with id in page
// (before the submit button adds its own name): every named input with
// its value (checkboxes and radios only when checked), the selected option
// of every select, and every textarea.
func formValues(t *testing.T, page, id string) url.Values {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	attr := func(n *html.Node, k string) (string, bool) {
		for _, a := range n.Attr {
			if a.Key == k {
				return a.Val, true
			}
		}
		return "", false
	}
	var form *html.Node
	var find func(*html.Node)
	find = func(n *html.Node) {
		if v, _ := attr(n, "id"); n.Type == html.ElementNode && n.Data == "form" && v == id {
			form = n
			return
		}
		for c := n.FirstChild; c != nil && form == nil; c = c.NextSibling {
			find(c)
		}
	}
	find(doc)
	if form == nil {
		t.Fatalf("no form #%s in the page", id)
	}
	out := url.Values{}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			name, named := attr(n, "name")
			switch n.Data {
			case "input":
				typ, _ := attr(n, "type")
				val, _ := attr(n, "value")
				_, checked := attr(n, "checked")
				switch {
				case !named || typ == "submit" || typ == "button":
				case typ == "checkbox" || typ == "radio":
					if checked {
						if _, has := attr(n, "value"); !has {
							val = "on"
						}
						out.Add(name, val)
					}
				default:
					out.Add(name, val)
				}
			case "select":
				for o := n.FirstChild; o != nil; o = o.NextSibling {
					if _, sel := attr(o, "selected"); o.Type == html.ElementNode && o.Data == "option" && sel && named {
						v, _ := attr(o, "value")
						out.Add(name, v)
					}
				}
			case "textarea":
				if named && n.FirstChild != nil {
					out.Add(name, n.FirstChild.Data)
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(form)
	return out
}
